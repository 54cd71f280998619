"""How much attention the prompt's own queries pay each entry, read at the prefill.

SnapKV votes with the last ``window`` prompt queries; H2O starts its heavy-hitter scores from
every prompt query. Both need the causal softmax of those queries against the prompt keys,
which the prefill's fused kernel does not return, so it is computed here once per layer, in
query chunks that bound memory at long prompts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.base import LayerView

# Attention logits materialised at once (float32 elements): 256 MiB.
CHUNK_ELEMENTS = 1 << 26


def prompt_attention_votes(view: LayerView, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Causal softmax weights of ``view.queries`` (the trailing prompt queries) summed over queries.

    Returns ``(kv_heads, T)``: for every entry, the weight the queries put on it, summed over
    the queries and averaged over each KV head's query group (entries after a query get none
    of its weight).
    """
    kv_heads, length, dim = view.keys.shape
    queries = view.queries.float()
    heads, count = queries.shape[0], queries.shape[1]
    grouped = queries.view(kv_heads, heads // kv_heads, count, dim)
    keys = view.keys.float().transpose(-1, -2).unsqueeze(1)
    entry = torch.arange(length, device=keys.device)
    rows = max(1, chunk_elements // (heads * length))
    votes = torch.zeros(kv_heads, heads // kv_heads, length, device=keys.device)
    for start in range(0, count, rows):
        block = grouped[:, :, start : start + rows]
        logits = torch.matmul(block, keys) * view.scaling
        query_pos = torch.arange(length - count + start, length - count + start + block.shape[2], device=keys.device)
        logits = logits.masked_fill(entry[None, :] > query_pos[:, None], -torch.inf)
        votes += logits.softmax(dim=-1).sum(dim=2)
    return votes.mean(dim=1)
