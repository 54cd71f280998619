"""Cumulative scores (H2O, Zhang et al. 2023, arXiv:2306.14048): accumulated attention picks the heavy hitters."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.aggregators.base import Aggregator


@dataclass
class Cumulative(Aggregator):
    """``m += s``."""

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return state + score

    def fold(self, rows: Tensor, positions: Tensor, score: Tensor) -> None:
        rows.scatter_add_(1, positions, score)

    def layer_coefficients(self, layers: int) -> tuple[float, tuple[float, ...]]:
        return 1.0, (1.0,) * layers
