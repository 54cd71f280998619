"""Budgets shared across KV heads: a layer's heads (AdaKV) or every head of every layer (KVzip).

AdaKV (Feng et al. 2025, arXiv:2407.11550) keeps, of a layer's ``H * B`` slots, the entries with
the highest scores over all its heads together, so a head whose scores are concentrated gives
slots to one whose scores are spread; a safeguard keeps each head's own top
``floor(safeguard * B)`` (kvpress's ``AdaKVPress``, ``alpha_safeguard=0.20``). KVzip pools the
same way over every layer and head. The result is ragged: per head its own count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from methods.selection import exact_floor


def pooled_keep(priorities: Sequence[Tensor], total: int) -> tuple[Tensor, ...]:
    """Per row (head), the sorted indices of its entries among the ``total`` highest priorities of all rows."""
    lengths = torch.tensor([row.numel() for row in priorities])
    flat = torch.cat([row.float() for row in priorities])
    chosen = flat.topk(total).indices.sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(chosen.device)
    owner = torch.bucketize(chosen, offsets[1:], right=True)
    counts = torch.bincount(owner, minlength=len(priorities)).tolist()
    return tuple((chosen - offsets[owner]).split(counts))


def adaptive_keep(
    priorities: Sequence[Tensor], protected: Sequence[Tensor], budget: int, safeguard: float
) -> tuple[Tensor, ...]:
    """AdaKV: a layer's ``len(priorities) * budget`` slots over its heads, each head keeping its protected
    entries and its own top ``floor(safeguard * budget)``.

    Parameters:
        priorities: per head, ``(T_h,)`` scores (higher is kept first).
        protected: per head, ``(T_h,)`` entries always kept (sinks, recent window).
        budget: B, the mean count per head.
        safeguard: the floor, a fraction of B.
    """
    floor = exact_floor(safeguard * budget)
    rows = []
    for priority, guarded in zip(priorities, protected, strict=True):
        row = priority.float().masked_fill(guarded, torch.inf)
        if floor:
            row = row.scatter(0, row.topk(min(floor, row.numel())).indices, torch.inf)
        rows.append(row)
    return pooled_keep(rows, budget * len(rows))
