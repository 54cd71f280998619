"""Per-KV-head eviction by a layer-local score, as kvpress's presses run it (KeyDiff, AdaKV + Expected Attention).

A scorer ranks a layer's entries from what that layer shows (keys, values, its queries); every
KV head keeps its ``B`` best (``allocation=uniform``) or the layer's ``H * B`` slots go to the
best entries over all its heads with AdaKV's safeguard floor (``allocation=adaptive``,
``methods.allocation``), which makes the layer ragged.

``schedule=prefill`` (the InertiaKV paper's Table 4 protocol, kvpress's prefill presses): the
prompt is scored and cut layer by layer inside the prefill forward, then the cache grows by the
generated tokens. ``schedule=decode``: also at every decode step the layer is scored again and
cut back to the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.allocation import adaptive_keep
from methods.base import EvictionMethod, KeepPlan, LayerKeep, LayerView, SequenceInfo
from methods.options import require_number
from methods.scorers.base import Scorer
from methods.selection import Selection

SCHEDULES = ("prefill", "decode")
ALLOCATIONS = ("uniform", "adaptive")


def _rows(value: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return value if isinstance(value, tuple) else tuple(value.unbind(0))


@dataclass
class HeadScoredEviction(EvictionMethod):
    """Keep, per layer and KV head, the entries ``scorer`` ranks highest.

    Parameters:
        scorer: a layer-local score (``methods.scorers``), computed from the prompt's queries at
            the prefill and from the current query at decode steps.
        selection: budget B, protected sinks and window; granularity ``head``.
        allocation: ``uniform`` (every head keeps B) or ``adaptive`` (AdaKV: the layer's H*B
            over all heads, each keeping at least ``floor(safeguard * B)``).
        safeguard: AdaKV's floor as a fraction of B (kvpress: 0.20).
        schedule: ``prefill`` (cut once, inside the prefill) or ``decode`` (and at every step).
        name: label for records and tables.
    """

    scorer: Scorer
    selection: Selection
    allocation: str = "uniform"
    safeguard: float = 0.2
    schedule: str = "prefill"
    name: str = "head_scored"

    def __post_init__(self) -> None:
        if self.selection.granularity != "head":
            raise ValueError(
                f"method.selection.granularity={self.selection.granularity!r} does not suit {self.name}, which keeps "
                "entries per KV head — use method.selection.granularity=head"
            )
        if self.allocation not in ALLOCATIONS:
            raise ValueError(
                f"method.allocation={self.allocation!r} is not an allocation — use one of {', '.join(ALLOCATIONS)}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"method.schedule={self.schedule!r} is not a schedule — use prefill (cut once, inside the prefill)"
                " or decode (and at every decode step)"
            )
        require_number("method.safeguard", self.safeguard, 0.2, minimum=0.0, maximum=1.0)
        ragged = self.allocation == "adaptive" and self.schedule == "decode"
        if ragged and not getattr(self.scorer, "scores_ragged", False):
            raise ValueError(
                f"method.allocation=adaptive with method.schedule=decode rescores ragged layers, which "
                f"{type(self.scorer).__name__} cannot score — use method.schedule=prefill, or a scorer that can"
                " (method/scorer=expected_attention)"
            )

    def check(self, info: SequenceInfo) -> int | None:
        return self.selection.budget_for(info.prefill_len)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self._scores: dict[int, Tensor | tuple[Tensor, ...]] = {}
        self.scorer.begin(info)

    def budget(self) -> int | None:
        return self._budget

    def appends_only(self) -> bool:
        return self.schedule == "prefill"

    @property
    def wants_prefill_queries(self) -> int:
        # Every prompt query: Expected Attention's statistics are over the whole prompt.
        return 0 if self._budget is None or self._budget >= self.info.prefill_len else self.info.prefill_len

    def observes(self, step: int) -> bool:
        return self._budget is not None and self.schedule == "decode"

    def observe_prefill(self, view: LayerView) -> None:
        self._scores[view.layer] = self.scorer.score(view)

    def observe(self, view: LayerView) -> None:
        self._scores[view.layer] = self.scorer.score(view)

    def _choose(self, layer: int, positions: Tensor | tuple[Tensor, ...], seen: int) -> LayerKeep:
        scores = self._scores.pop(layer)
        if self.allocation == "uniform":
            return self.selection.select(scores, positions, seen, self._budget)
        rows = _rows(positions)
        protected = [self.selection.protected(row, seen, self._budget) for row in rows]
        return adaptive_keep(_rows(scores), protected, self._budget, self.safeguard)

    def keep_prefill_layer(self, layer: int, positions: Tensor) -> LayerKeep | None:
        if layer not in self._scores:
            return None
        return self._choose(layer, positions, self.info.prefill_len)

    def _within_budget(self, positions: Tensor | tuple[Tensor, ...]) -> bool:
        counts = [row.numel() for row in _rows(positions)]
        if self.allocation == "uniform":
            return max(counts) <= self._budget
        return sum(counts) <= self._budget * len(counts)

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if step == 0 or not self._scores:
            return None
        if self._within_budget(positions[0]):
            self._scores.clear()
            return None
        seen = self.info.prefill_len + step
        return [self._choose(layer, layer_positions, seen) for layer, layer_positions in enumerate(positions)]
