"""Several sequences' scored eviction as one steady step: the ``RowStack`` of ``methods.scored``.

The rows' states, ``(layers', rows, C_r)`` each, sit in one ``(layers', N, rows, C + 1)`` tensor, C the largest
capacity. Column C, ``pad``, belongs to no entry: the positions table's slots past a row's own ``B_r + 1``
hold it, their scores are set to 0 so its state stays 0, and they are never evicted. Every operation is the
one each row's ``ScoredEviction`` does in its steady loop, with the row dimension N in front; the values that
differ per row (the budget, the recent window, the static reserve, the tokens seen) are tensors over N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from methods.base import LayerView, RowStack
from methods.selection import evict_unprotected

if TYPE_CHECKING:
    from methods.scored import ScoredEviction


class ScoredRows(RowStack):
    """The steady loops of ``methods`` (one ``ScoredEviction`` per row, equal options, each steady) as one."""

    def __init__(self, methods: list[ScoredEviction]) -> None:
        first = methods[0]
        self.methods, self.selection = methods, first.selection
        self.scorer, self.aggregator = first.scorer, first.aggregator
        self.shared_layer = first.selection.granularity == "token"
        self.pooled = first.selection.granularity != "head"
        layers, rows, _ = first.state.shape
        self.pad = max(method.state.shape[-1] for method in methods)
        self.state = first.state.new_zeros(layers, len(methods), rows, self.pad + 1)
        for row, method in enumerate(methods):
            self.state[:, row, :, : method.state.shape[-1]] = method.state
        device = first.state.device
        budgets = [method.budget() for method in methods]
        size = torch.arange(max(budgets) + 1)
        self.free = (size[None, :] > torch.tensor(budgets)[:, None]).to(device)
        self.others = torch.tensor(budgets, dtype=self.state.dtype, device=device).view(1, -1, 1, 1)
        recent = [first.selection.recent(budget) for budget in budgets]
        self.recent = torch.tensor(recent, device=device).view(1, -1, 1, 1)
        self.reserved = None
        if first._reserved is not None:
            self.reserved = torch.zeros(1, len(methods), 1, self.pad + 1, dtype=torch.bool, device=device)
            for row, method in enumerate(methods):
                self.reserved[0, row, 0, : method._reserved.numel()] = method._reserved

    def observe(self, view: LayerView) -> None:
        scores = self.scorer.score(view)
        if self.pooled:
            scores = scores.mean(dim=-2, keepdim=True)
        scores = scores.masked_fill(self.free[:, None, :], 0.0)
        state = self.state[0 if self.shared_layer else view.layer]
        length = scores.shape[-1]
        self.aggregator.fold(
            state.view(-1, state.shape[-1]), view.positions.reshape(-1, length), scores.reshape(-1, length)
        )

    def evict_one(self, positions: Tensor, seen: Tensor, observed: bool) -> Tensor:
        seen = seen.view(1, -1, 1, 1)
        if not observed:
            self._init_newest(positions, seen - 1)
        priority = self.state.gather(3, positions)
        protected = self.selection.protected_from(positions, seen - self.recent, self.reserved)
        return evict_unprotected(priority, protected | self.free[None, :, None, :])

    def _init_newest(self, table: Tensor, newest: Tensor) -> None:
        """``ScoredEviction._init_newest`` per row: the newest slot and the pads hold 0, so the sum is the others'."""
        mean = self.state.gather(3, table).sum(dim=3, keepdim=True) / self.others
        self.state.scatter_(3, newest.expand_as(mean), mean)

    def unstack(self) -> None:
        for row, method in enumerate(self.methods):
            method.state.copy_(self.state[:, row, :, : method.state.shape[-1]])
