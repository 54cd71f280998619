"""Single-step scores (TOVA, Oren et al. 2024, arXiv:2401.06104): only the latest step counts."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.aggregators.base import Aggregator


@dataclass
class SingleStep(Aggregator):
    """``m = s``."""

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return score

    def fold(self, rows: Tensor, positions: Tensor, score: Tensor) -> None:
        rows.scatter_(1, positions, score)
