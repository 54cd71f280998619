"""KVpop's fixed-budget sparse attention for base-model distillation, and the StreamingLLM+ pattern.

With static priorities (``n = 1``, ``methods.kvpop.policy``), sequential eviction keeps exactly the
top-k candidates by priority, so a whole sequence can be run in one forward with the attention
pattern the engine produces token by token: query ``q`` sees the sinks, the window
``[q - w, q]`` and the ``k`` highest-priority tokens among ``[s, q - 1 - w]`` (the cache after the
eviction of step ``q - 1``, plus the new token). The running top-k over a growing candidate set is
a Fenwick tree over priority ranks (``O(S log S)`` per head). Distillation fine-tunes the base
model so that under this mask its next-token distribution matches the dense model's (KL).
StreamingLLM+ trains the same way with the fixed sinks + recent pattern of the same budget.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import PreTrainedModel

from harness.attention import AttentionFunction, Call


def running_topk_rank(priority: Tensor, sinks: int, window: int, k: int) -> Tensor:
    """For every query ``q``, the largest priority rank kept among candidates ``[s, q - 1 - w]``.

    ``priority`` ``(rows, S)``; rank 0 is the highest priority of a row (ties broken by position).
    Returns ``(rows, S)`` ranks (``-1``: no candidate yet; all candidates kept while fewer than k).
    A Fenwick tree counts the candidate ranks inserted so far; binary lifting finds the k-th smallest.
    """
    rows, length = priority.shape
    order = priority.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(length).expand(rows, -1))
    tree = torch.zeros(rows, length + 1, dtype=torch.long)
    counts = torch.zeros(rows, dtype=torch.long)
    out = torch.full((rows, length), -1, dtype=torch.long)
    top_bit = 1 << (length.bit_length() - 1) if length else 0
    row_index = torch.arange(rows)
    for query in range(length):
        newest = query - 1 - window
        if newest >= sinks:
            index = rank[:, newest] + 1
            while True:  # Fenwick insert of one rank per row (all rows move in lockstep)
                live = index <= length
                if not live.any():
                    break
                tree[row_index[live], index[live]] += 1
                index = index + (index & -index)
            counts += 1
        if counts[0] == 0:
            continue
        need = counts.clamp_max(k)
        position = torch.zeros(rows, dtype=torch.long)
        step = top_bit
        while step:  # largest position with prefix count < need: the need-th rank is position
            ahead = position + step
            fits = ahead <= length
            value = tree[row_index, ahead.clamp_max(length)]
            move = fits & (value < need)
            need = need - torch.where(move, value, 0)
            position = torch.where(move, ahead, position)
            step >>= 1
        out[:, query] = position  # 1-based tree index - 1 = 0-based rank
    return out


def kvpop_mask(priority: Tensor, sinks: int, window: int, k: int) -> Tensor:
    """``(rows, S, S)`` boolean attention pattern of the KVpop policy for static ``priority`` ``(rows, S)``."""
    length = priority.shape[-1]
    order = priority.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(length).expand_as(order))
    threshold = running_topk_rank(priority, sinks, window, k)
    queries = torch.arange(length)[:, None]
    keys = torch.arange(length)[None, :]
    fixed = (keys <= queries) & ((keys < sinks) | (keys >= queries - window))
    candidate = (keys >= sinks) & (keys <= queries - 1 - window)
    chosen = candidate[None] & (rank[:, None, :] <= threshold[:, :, None])
    return fixed[None] | chosen


def streaming_mask(length: int, sinks: int, window: int, k: int) -> Tensor:
    """``(S, S)`` StreamingLLM+ pattern with the same budget: sinks and the ``w + k + 1`` latest tokens."""
    queries = torch.arange(length)[:, None]
    keys = torch.arange(length)[None, :]
    return (keys <= queries) & ((keys < sinks) | (keys >= queries - window - k))


def _masked(masks: list[Tensor], call: Call) -> tuple[Tensor, None]:
    """Attention under the active per-layer mask ``(kv_heads or 1, S, S)`` (dense masked SDPA; a
    FlexAttention block mask is the GPU-scale form of the same pattern)."""
    group = call.query.shape[1] // call.key.shape[1]
    mask = masks[call.layer].to(call.query.device)
    mask = mask.repeat_interleave(group, dim=0) if mask.shape[0] > 1 else mask
    output = F.scaled_dot_product_attention(
        call.query,
        call.key.repeat_interleave(group, dim=1),
        call.value.repeat_interleave(group, dim=1),
        attn_mask=mask[None],
        scale=call.scaling,
    )
    return output.transpose(1, 2).contiguous(), None


#: ``with SPARSE.active(masks, model):`` runs ``model`` with ``masks[layer]`` as its attention pattern.
SPARSE = AttentionFunction("kvpop_sparse", _masked)


def distillation_loss(model: PreTrainedModel, ids: Tensor, masks: list[Tensor], first: int) -> Tensor:
    """``KL(dense || sparse)`` of the next-token distributions at positions ``>= first`` of ``ids`` ``(1, S)``.

    The dense teacher is the same model without the mask (no gradient); the student is the model
    under ``masks``, so the fine-tuned weights learn to work with the evicted cache.
    """
    with torch.no_grad():
        teacher = model(input_ids=ids, use_cache=False).logits[0, first:].float().log_softmax(-1)
    with SPARSE.active(masks, model):
        student = model(input_ids=ids, use_cache=False).logits[0, first:].float().log_softmax(-1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")
