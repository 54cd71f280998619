"""How much attention the prompt's own queries pay each entry, read at the prefill.

SnapKV votes with the last ``window`` prompt queries; H2O starts its heavy-hitter scores from
every prompt query. Both need column sums of the causal softmax of those queries against the
prompt keys, which the prefill's fused kernel does not return. Where the engine can, it hands
them over computed by a fused kernel (``LayerView.query_mass``: on CPU, one transposed pass that
uses the log-normalisers of the prefill's own attention, about 1.4x a causal attention at 4k
against 13x for the softmax here). Otherwise they are computed here, without an S x S matrix and
without a second softmax: the weight query i pays entry j is ``exp(q_i . k_j * scale - lse_i)``,
with ``lse_i`` the row's log-normaliser from a first blockwise pass. Entries after a query's
position get none of its weight, so each block of queries only reads the keys up to its last row,
and only its last ``rows`` columns need a causal mask, made as the block is reached: the extra
memory is one block's logits (``CHUNK_ELEMENTS``) and a ``rows x rows`` mask, never ``T x T``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.base import LayerView

# Attention logits materialised at once (float32 elements): 256 MiB.
CHUNK_ELEMENTS = 1 << 26


def _blocks(view: LayerView, chunk_elements: int) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """fp32 grouped queries ``(Hkv, group, Q, D)``, fp32 keys ``(Hkv, D, T)``, and the blocks of query
    rows ``(first row, last row + 1)`` whose logits fit in ``chunk_elements``."""
    kv_heads, length, dim = view.keys.shape
    heads, count = view.queries.shape[0], view.queries.shape[1]
    grouped = view.queries.float().view(kv_heads, heads // kv_heads, count, dim)
    keys = view.keys.float().transpose(-1, -2)
    rows = max(1, chunk_elements // (heads * length))
    return grouped, keys, [(start, min(start + rows, count)) for start in range(0, count, rows)]


def _logits(grouped: Tensor, keys: Tensor, start: int, end: int, scaling: float) -> Tensor:
    """The block's causal logits ``(Hkv, group, rows, visible)``: the keys up to its last row, its own
    ``rows x rows`` corner masked where a key comes after a query."""
    kv_heads, group, _, dim = grouped.shape
    visible = keys.shape[-1] - grouped.shape[2] + end
    rows = end - start
    # One product per KV head over its whole query group: broadcasting the keys over the group would copy them.
    block = grouped[:, :, start:end].reshape(kv_heads, group * rows, dim)
    logits = torch.bmm(block, keys[:, :, :visible]).view(kv_heads, group, rows, visible) * scaling
    corner = torch.arange(rows, device=keys.device)
    hidden = corner[None, :] > corner[:, None]
    logits[..., visible - rows :].masked_fill_(hidden, -torch.inf)
    return logits


def causal_logsumexp(view: LayerView, chunk_elements: int = CHUNK_ELEMENTS) -> Tensor:
    """Log-normaliser of every query row of ``view.queries`` over the keys it sees, ``(query_heads, Q)``."""
    return _logsumexp(*_blocks(view, chunk_elements), view.scaling).flatten(0, 1)


def _logsumexp(grouped: Tensor, keys: Tensor, blocks: list[tuple[int, int, Tensor]], scaling: float) -> Tensor:
    parts = [_logits(grouped, keys, start, end, scaling).logsumexp(-1) for start, end in blocks]
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
    for start, end in blocks:
        logits = _logits(grouped, keys, start, end, view.scaling)
        votes[..., : logits.shape[-1]] += (logits - lse[:, :, start:end, None]).exp().sum(dim=2)
    return votes.mean(dim=1)
