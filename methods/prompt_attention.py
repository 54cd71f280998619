"""How much attention the prompt's own queries pay each entry, read at the prefill.

SnapKV votes with the last ``window`` prompt queries; H2O starts its heavy-hitter scores from
every prompt query. Both need column sums of the causal softmax of those queries against the
prompt keys, which the prefill's fused kernel does not return. Where the engine can, it hands
them over computed by a fused kernel (``LayerView.query_mass``: on CPU, one transposed pass that
uses the log-normalisers of the prefill's own attention, about 1.4x a causal attention at 4k
against 13x for the softmax here). Otherwise they are computed here, without an S x S matrix and
without a second softmax: the weight query i pays entry j is ``exp(q_i . k_j * scale - lse_i)``,
with ``lse_i`` the row's log-normaliser from a first blockwise pass. Entries after a query's
position get none of its weight, so each block of queries only reads the keys up to its last row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.base import LayerView

# Attention logits materialised at once (float32 elements): 256 MiB.
CHUNK_ELEMENTS = 1 << 26


def _blocks(view: LayerView, chunk_elements: int) -> tuple[Tensor, Tensor, list[tuple[int, int, Tensor]]]:
    """fp32 grouped queries ``(Hkv, group, Q, D)``, fp32 keys ``(Hkv, D, T)``, and per block of query
    rows ``(first row, last row + 1, causal mask of the block's logits)``."""
    kv_heads, length, dim = view.keys.shape
    heads, count = view.queries.shape[0], view.queries.shape[1]
    grouped = view.queries.float().view(kv_heads, heads // kv_heads, count, dim)
    keys = view.keys.float().transpose(-1, -2)
    rows = max(1, chunk_elements // (heads * length))
    blocks = []
    for start in range(0, count, rows):
        end = min(start + rows, count)
        visible = length - count + end
        query_pos = torch.arange(length - count + start, visible, device=keys.device)
        hidden = torch.arange(visible, device=keys.device)[None, :] > query_pos[:, None]
        blocks.append((start, end, hidden))
    return grouped, keys, blocks


def _logits(grouped: Tensor, keys: Tensor, start: int, end: int, hidden: Tensor, scaling: float) -> Tensor:
    logits = torch.matmul(grouped[:, :, start:end], keys[:, None, :, : hidden.shape[1]]) * scaling
    return logits.masked_fill(hidden, -torch.inf)


def causal_logsumexp(view: LayerView, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Log-normaliser of every query row of ``view.queries`` over the keys it sees, ``(query_heads, Q)``."""
    return _logsumexp(*_blocks(view, chunk_elements), view.scaling).flatten(0, 1)


def _logsumexp(grouped: Tensor, keys: Tensor, blocks: list[tuple[int, int, Tensor]], scaling: float) -> Tensor:
    parts = [_logits(grouped, keys, start, end, hidden, scaling).logsumexp(-1) for start, end, hidden in blocks]
    return torch.cat(parts, dim=-1)


def prompt_attention_votes(view: LayerView, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Causal softmax weights of ``view.queries`` (the trailing prompt queries) summed over queries.

    Returns ``(kv_heads, T)``: for every entry, the weight the queries put on it, summed over
    the queries and averaged over each KV head's query group (entries after a query get none
    of its weight).
    """
    kv_heads, length, _ = view.keys.shape
    if view.query_mass is not None:
        return view.query_mass().to(view.keys.device).view(kv_heads, -1, length).mean(dim=1)
    grouped, keys, blocks = _blocks(view, chunk_elements)
    lse = _logsumexp(grouped, keys, blocks, view.scaling)
    votes = torch.zeros(*grouped.shape[:2], keys.shape[-1], device=keys.device)
    for start, end, hidden in blocks:
        logits = _logits(grouped, keys, start, end, hidden, view.scaling)
        votes[..., : hidden.shape[1]] += (logits - lse[:, :, start:end, None]).exp().sum(dim=2)
    return votes.mean(dim=1)
