"""Several sequences' scored eviction as one steady step: the ``RowStack`` of ``methods.scored``.

The rows' states, ``(layers', rows, C_r)`` each, sit in one ``(layers', N, rows, C + 1)`` tensor, C the largest
capacity. Column C, ``pad``, belongs to no entry: the positions table's slots past a row's own ``B_r + 1``
hold it, their scores are set to 0 so its state stays 0, and they are never evicted. Every operation is the
one each row's ``ScoredEviction`` does in its steady loop, with the row dimension N in front; the values that
differ per row (the budget, the recent window, the static reserve, the tokens seen, the step) are tensors over N.

Rows that observe at different steps (Lazy-r's rows, joined at different times) are followed on the device:
each row's step advances there, and at a step only some rows observe the others' states are put back after
the fold and their newest entries take the mean instead, as each row's own loop does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from methods.aggregators.base import Aggregator, StepFold
from methods.base import LayerView, RowStack
from methods.scorers.base import Scorer
from methods.selection import Selection, evict_unprotected


class ScoredRows(RowStack):
    """The steady loops of several ``ScoredEviction`` rows of equal options, each steady, as one.

    Parameters:
        states: each row's state ``(layers', rows, C_r)``, written back by ``unstack``.
        budgets: each row's budget B_r.
        reserved: each row's static reserve mask ``(C_r,)``, or None without one.
        steps: each row's next decode step.
        observes: a row's ``ScoredEviction.observes``, which takes the rows' steps as a tensor too.
        selection, scorer, aggregator: the rows' shared options.
        layers: the model's layer count.
        regrouped: the rows' arithmetic is regrouped (``ScoredEviction._regrouped``: scores pooled at once, a
            token-granularity state decayed once a step).
        step_fold: how a step's layers fold at once (``numerics`` 4, ``ScoredEviction._layer_fold``), or None.
    """

    def __init__(
        self,
        states: list[Tensor],
        budgets: list[int],
        reserved: list[Tensor | None],
        steps: list[int],
        observes: Callable[[Tensor], Tensor],
        selection: Selection,
        scorer: Scorer,
        aggregator: Aggregator,
        layers: int,
        regrouped: bool,
        step_fold: StepFold | None = None,
    ) -> None:
        self.states, self.selection, self.scorer, self.aggregator = states, selection, scorer, aggregator
        self.layers, self.regrouped, self.step_fold = layers, regrouped, step_fold
        self.pending: list[LayerView] = []
        self.shared_layer = selection.granularity == "token"
        self.pooled = selection.granularity != "head"
        state_layers, rows, _ = states[0].shape
        self.pad = max(state.shape[-1] for state in states)
        self.state = states[0].new_zeros(state_layers, len(states), rows, self.pad + 1)
        for row, state in enumerate(states):
            self.state[:, row, :, : state.shape[-1]] = state
        device = states[0].device
        size = torch.arange(max(budgets) + 1)
        self.free = (size[None, :] > torch.tensor(budgets)[:, None]).to(device)
        self.others = torch.tensor(budgets, dtype=self.state.dtype, device=device).view(1, -1, 1, 1)
        self.recent = torch.tensor([selection.recent(budget) for budget in budgets], device=device).view(1, -1, 1, 1)
        self.protects = any(selection.protects(budget) for budget in budgets)
        self.steps = torch.tensor(steps, device=device).view(1, -1, 1, 1)
        self.observes = observes
        #: Which rows observe the current step, ``(1, N, 1, 1)``.
        self.observing = observes(self.steps)
        self.reserved = None
        if reserved[0] is not None:
            self.reserved = torch.zeros(1, len(states), 1, self.pad + 1, dtype=torch.bool, device=device)
            for row, mask in enumerate(reserved):
                self.reserved[0, row, 0, : mask.numel()] = mask

    def observe(self, view: LayerView, some: bool) -> None:
        if self.step_fold is not None:
            self.pending.append(view)
            if view.layer < self.layers - 1:
                return
            views, self.pending = self.pending, []
            scores = self.scorer.layer_mean(views, self.step_fold.weights)
        elif self.pooled and self.regrouped:
            scores = self.scorer.pooled(view)
        else:
            scores = self.scorer.score(view)
            scores = scores.mean(dim=-2, keepdim=True) if self.pooled else scores
        scores = scores.masked_fill(self.free[:, None, :], 0.0)
        state = self.state[0 if self.shared_layer else view.layer]
        before = state.clone() if some else None
        length = scores.shape[-1]
        rows = state.view(-1, state.shape[-1])
        positions, scores = view.positions.reshape(-1, length), scores.reshape(-1, length)
        if self.step_fold is not None:
            self.step_fold.fold(rows, positions, scores)
        elif self.shared_layer and self.regrouped:
            self.aggregator.fold_layers(rows, positions, scores, view.layer, self.layers)
        else:
            self.aggregator.fold(rows, positions, scores)
        if before is not None:
            state.copy_(torch.where(self.observing[0], state, before))

    def evict_one(self, positions: Tensor, seen: Tensor, observed: bool, some: bool) -> Tensor:
        seen = seen.view(1, -1, 1, 1)
        if not observed or some:
            self._init_newest(positions, seen - 1, self.observing if some else None)
        priority = self.state.gather(3, positions)
        protected = self.free[None, :, None, :]
        if self.protects:
            protected = protected | self.selection.protected_from(positions, seen - self.recent, self.reserved)
        slots = evict_unprotected(priority, protected)
        self.steps.add_(1)
        self.observing.copy_(self.observes(self.steps))
        return slots

    def _init_newest(self, table: Tensor, newest: Tensor, observed: Tensor | None) -> None:
        """``ScoredEviction._init_newest`` per row: the newest slot and the pads hold 0, so the sum is the others'.
        The rows ``observed`` names keep the state their observation gave the newest entry."""
        mean = self.state.gather(3, table).sum(dim=3, keepdim=True) / self.others
        at = newest.expand_as(mean)
        if observed is not None:
            mean = torch.where(observed, self.state.gather(3, at), mean)
        self.state.scatter_(3, at, mean)

    def unstack(self) -> None:
        for row, state in enumerate(self.states):
            state.copy_(self.state[:, row, :, : state.shape[-1]])
