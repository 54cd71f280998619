"""InertiaKV's adaptive-alpha selector (arXiv 2609.03515, App. H): noise and drift from a warm-up.

During the first ``warmup`` decode steps the rule is EMA with ``alpha``; it measures

- the noise sigma: the cross-layer Jaccard disagreement, ``1 - J`` of the top-k entries of
  consecutive layers' fresh scores, k = ceil(top_fraction * B), averaged over layers and steps;
- the drift delta: ``1 - J`` of the top-B entries by state at consecutive steps (how fast the
  retained set moves), averaged over steps;

then fixes alpha for the rest of the sequence at the candidate minimising the two-term risk of
Eq. 5, ``(1 - a)/(1 + a) * eta^2 + (a / (1 - a))^2`` with ``eta = sigma / delta``: the first
term is Prop. 1(b)'s boundary variance in units of delta^2, the second the squared lag of an
EMA tracking a ranking that drifts by delta per step. The paper gives neither k nor the
candidate set; k follows the 10% selectivity of its budget and the candidates are the values
App. H names (it reports choices of 0.8 or 0.95, never low alpha). Add 0.9 with
``method.aggregator.candidates=[0,0.3,0.5,0.8,0.9,0.95]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from methods.aggregators.base import Aggregator, top_k, top_positions
from methods.base import SequenceInfo
from methods.options import require_int, require_number
from methods.overlap import tensor_jaccard

CANDIDATES = (0.0, 0.3, 0.5, 0.8, 0.95)


def risk(alpha: float, eta: float) -> float:
    """Eq. 5's boundary term plus lag term, in units of the squared drift."""
    return (1 - alpha) / (1 + alpha) * eta**2 + (alpha / (1 - alpha)) ** 2


def choose(eta: float, candidates: tuple[float, ...] | list[float]) -> float:
    """The candidate alpha of least ``risk`` (ties: the smaller alpha); no measured drift: the largest."""
    if math.isinf(eta):
        return max(candidates)
    return min(sorted(candidates), key=lambda a: risk(a, eta))


@dataclass
class AdaptiveEMA(Aggregator):
    """EMA whose alpha is chosen once per sequence from a warm-up's noise and drift.

    Parameters:
        alpha: the coefficient during the warm-up (InertiaKV's default 0.8).
        warmup: decode steps measured before choosing (App. H: 10).
        candidates: the alphas it may choose from.
        top_fraction: k = ceil(top_fraction * B) for the cross-layer disagreement.
    """

    adapts = True

    alpha: float = 0.8
    warmup: int = 10
    candidates: list[float] = field(default_factory=lambda: list(CANDIDATES))
    top_fraction: float = 0.1

    def __post_init__(self) -> None:
        where = "method.aggregator"
        require_number(f"{where}.alpha", self.alpha, 0.8, minimum=0.0, maximum=1.0, open_max=True)
        require_int(f"{where}.warmup", self.warmup, minimum=2, example=10)
        require_number(f"{where}.top_fraction", self.top_fraction, 0.1, minimum=0.0, maximum=1.0)
        if not self.candidates:
            raise ValueError(f"{where}.candidates is empty — use e.g. {where}.candidates=[0,0.3,0.5,0.8,0.95]")
        for value in self.candidates:
            require_number(f"{where}.candidates entry", value, 0.8, minimum=0.0, maximum=1.0, open_max=True)

    def begin(self, info: SequenceInfo) -> None:
        self.current = self.alpha
        self.chosen: float | None = None
        self._layers: list[tuple[Tensor, Tensor]] = []
        self._sigmas: list[float] = []
        self._deltas: list[float] = []
        self._previous_top: Tensor | None = None
        self.eta: float | None = None

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return self.current * state + (1.0 - self.current) * score

    def watch(self, layer: int, positions: Tensor, score: Tensor) -> None:
        if self.chosen is None:
            self._layers.append((positions[0], score[0]))

    def end_step(self, step: int, positions: Tensor, state: Tensor, budget: int) -> None:
        layers, self._layers = self._layers, []
        if self.chosen is not None:
            return
        k = top_k(budget, self.top_fraction)
        tops = [top_positions(p, s, k) for p, s in layers]
        if len(tops) > 1:
            disagreements = [1 - tensor_jaccard(a, b) for a, b in zip(tops, tops[1:], strict=False)]
            self._sigmas.append(sum(disagreements) / (len(tops) - 1))
        retained = top_positions(positions[0], state[0], budget)
        if self._previous_top is not None:
            self._deltas.append(1 - tensor_jaccard(self._previous_top, retained))
        self._previous_top = retained
        if step >= self.warmup:
            sigma = sum(self._sigmas) / max(len(self._sigmas), 1)
            delta = sum(self._deltas) / max(len(self._deltas), 1)
            self.eta = math.inf if delta == 0 else sigma / delta
            self.chosen = self.current = choose(self.eta, self.candidates)

    def report(self) -> dict[str, float | None]:
        sigma = sum(self._sigmas) / len(self._sigmas) if self._sigmas else None
        delta = sum(self._deltas) / len(self._deltas) if self._deltas else None
        eta = None if self.eta is None or math.isinf(self.eta) else self.eta
        return {"alpha_chosen": self.chosen, "sigma": sigma, "delta": delta, "eta": eta}
