"""InertiaKV's reactive rank-disagreement trigger (arXiv 2609.03515, App. H).

EMA with ``alpha``, except that a step follows a step whose raw and aggregated rankings
disagreed by more than ``threshold`` runs with ``low_alpha``: disagreement is ``1 - J`` of the
top-k entries by the step's fresh score (mean over layers) and by the state after the step,
k = ceil(top_fraction * B), the raw/EMA Jaccard of Table 13. The trigger is causal: the step
that measures a disagreement has already been aggregated. The paper gives neither the
threshold nor the low alpha; 0.5 and 0.3 (LongBench-v2's best alpha in its Table 5) are ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.aggregators.base import Aggregator, top_k, top_positions
from methods.base import SequenceInfo
from methods.options import require_number
from methods.overlap import tensor_jaccard


@dataclass
class ReactiveEMA(Aggregator):
    """EMA that drops to ``low_alpha`` for one step after a raw/EMA disagreement above ``threshold``.

    Parameters:
        alpha: the coefficient otherwise (InertiaKV's default 0.8).
        low_alpha: the coefficient after a trigger.
        threshold: disagreement (``1 - Jaccard``, in [0, 1]) that triggers.
        top_fraction: k = ceil(top_fraction * B) of the compared top sets.
    """

    adapts = True

    alpha: float = 0.8
    low_alpha: float = 0.3
    threshold: float = 0.5
    top_fraction: float = 0.1

    def __post_init__(self) -> None:
        where = "method.aggregator"
        for option, example in (("alpha", 0.8), ("low_alpha", 0.3)):
            value = getattr(self, option)
            require_number(f"{where}.{option}", value, example, minimum=0.0, maximum=1.0, open_max=True)
        require_number(f"{where}.threshold", self.threshold, 0.5, minimum=0.0, maximum=1.0)
        require_number(f"{where}.top_fraction", self.top_fraction, 0.1, minimum=0.0, maximum=1.0)

    def begin(self, info: SequenceInfo) -> None:
        self.current = self.alpha
        self._raw: list[tuple[Tensor, Tensor]] = []
        self.steps = 0
        self.triggers = 0
        self.disagreements: list[float] = []

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return self.current * state + (1.0 - self.current) * score

    def watch(self, layer: int, positions: Tensor, score: Tensor) -> None:
        self._raw.append((positions[0], score[0]))

    def end_step(self, step: int, positions: Tensor, state: Tensor, budget: int) -> None:
        raw, self._raw = self._raw, []
        if not raw:
            return
        # The raw ranking: the layers' fresh scores summed per cached position (cached positions are sorted).
        cached = positions[0]
        total = torch.zeros_like(state[0])
        for layer_positions, score in raw:
            total.index_add_(0, torch.searchsorted(cached, layer_positions), score.to(total.dtype))
        k = top_k(budget, self.top_fraction)
        disagreement = 1 - tensor_jaccard(top_positions(cached, total, k), top_positions(cached, state[0], k))
        self.disagreements.append(disagreement)
        self.steps += 1
        triggered = disagreement > self.threshold
        self.triggers += triggered
        self.current = self.low_alpha if triggered else self.alpha

    def report(self) -> dict[str, float | None]:
        return {
            "trigger_rate": self.triggers / self.steps if self.steps else None,
            "disagreement": sum(self.disagreements) / len(self.disagreements) if self.disagreements else None,
        }
