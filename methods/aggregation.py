"""Temporal aggregation of per-step scores (InertiaKV, Section 3).

Each rule combines the state ``m`` of an entry with a fresh score ``s``. With token
granularity the state is one vector over positions shared by all layers and updated layer
after layer inside a step, so under EMA layer l of K carries weight ``(1-a) a^(K-l)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from torch import Tensor

from methods.options import require_number


class Aggregator(ABC):
    """A rule ``m <- f(m, s)``; states start at 0."""

    @abstractmethod
    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        """New state from the old state and a fresh score (same shapes)."""


@dataclass
class SingleStep(Aggregator):
    """``m = s``: only the latest score counts (TOVA)."""

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return score


@dataclass
class Cumulative(Aggregator):
    """``m += s``: accumulated attention (H2O's heavy hitters)."""

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return state + score


@dataclass
class EMA(Aggregator):
    """``m = alpha * m + (1 - alpha) * s`` (InertiaKV's momentum).

    Parameters:
        alpha: inertia in [0, 1); the paper's default is 0.8.
    """

    alpha: float = 0.8

    def __post_init__(self) -> None:
        require_number("method.aggregator.alpha", self.alpha, 0.8, minimum=0.0, maximum=1.0, open_max=True)

    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        return self.alpha * state + (1.0 - self.alpha) * score
