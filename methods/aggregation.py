"""Temporal aggregation of per-step scores (InertiaKV, Section 3).

Each rule combines the state ``m`` of an entry with a fresh score ``s``. With token
granularity the state is one vector over positions shared by all layers and updated layer
after layer inside a step, so under EMA layer l of K carries weight ``(1-a) a^(K-l)``.
Rules that adapt their own coefficient (App. H's selectors, ``methods.adaptive_alpha`` and
``methods.reactive_alpha``) also see each layer's fresh scores and the state after each step.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from methods.base import SequenceInfo
from methods.options import require_number


class Aggregator(ABC):
    """A rule ``m <- f(m, s)``; states start at 0."""

    #: Whether the rule adapts from ``watch``/``end_step`` (it then needs the shared token state).
    adapts: ClassVar[bool] = False

    def begin(self, info: SequenceInfo) -> None:
        """Reset per-sequence state (only adaptive rules have any)."""

    @abstractmethod
    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        """New state from the old state and a fresh score (same shapes)."""

    def watch(self, layer: int, positions: Tensor, score: Tensor) -> None:
        """One layer's fresh scores ``(rows, T)`` at ``positions`` during an observed step."""

    def end_step(self, step: int, positions: Tensor, state: Tensor, budget: int) -> None:
        """After observed decode step ``step``: the cached ``positions`` ``(1, T)``, their state, the budget."""

    def report(self) -> dict[str, float | None]:
        """What the rule decided for the current sequence (diagnostics)."""
        return {}


def top_positions(positions: Tensor, scores: Tensor, k: int) -> Tensor:
    """The positions of the ``k`` highest scores (1-D tensors over the same entries)."""
    return positions[scores.topk(min(k, scores.numel())).indices]


def overlap(a: Tensor, b: Tensor) -> float:
    """Jaccard |a ∩ b| / |a ∪ b| of two sets of positions (1-D tensors without repeats)."""
    shared = int(torch.isin(a, b).sum())
    union = a.numel() + b.numel() - shared
    return 1.0 if union == 0 else shared / union


def top_k(budget: int, fraction: float) -> int:
    """The traced set size ``ceil(fraction * B)``, at least 1."""
    return max(1, math.ceil(fraction * budget - 1e-9))


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
