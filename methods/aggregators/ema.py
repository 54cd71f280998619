"""Exponential moving average (InertiaKV, arXiv 2609.03515, Section 3): scores with momentum."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.aggregators.base import Aggregator, add_scaled
from methods.options import require_number


@dataclass
class EMA(Aggregator):
    """``m = alpha * m + (1 - alpha) * s``.

    Parameters:
        alpha: inertia in [0, 1); the paper's default is 0.8.
    """

    alpha: float = 0.8

    def __post_init__(self) -> None:
        require_number("method.aggregator.alpha", self.alpha, 0.8, minimum=0.0, maximum=1.0, open_max=True)

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return self.alpha * state + (1.0 - self.alpha) * score

    def fold(self, rows: Tensor, positions: Tensor, score: Tensor) -> None:
        # The whole row is scaled: an entry no longer cached never returns and one not cached yet is still 0,
        # so only the cached entries' values matter, and they round as in ``combine``.
        rows.mul_(self.alpha)
        add_scaled(rows, positions, score, 1.0 - self.alpha)

    def fold_layers(self, rows: Tensor, positions: Tensor, score: Tensor, layer: int, layers: int) -> None:
        # Layer l of L adds (1 - alpha) alpha^(L-1-l) of its score to the state alpha^L had at the step's start:
        # one decay per step instead of one per layer.
        if layer == 0:
            rows.mul_(self.alpha**layers)
        add_scaled(rows, positions, score, (1.0 - self.alpha) * self.alpha ** (layers - 1 - layer))

    def layer_coefficients(self, layers: int) -> tuple[float, tuple[float, ...]]:
        return self.alpha**layers, tuple(
            (1.0 - self.alpha) * self.alpha ** (layers - 1 - layer) for layer in range(layers)
        )
