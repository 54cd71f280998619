"""What an aggregator is: the temporal rule that folds each step's scores into a state (InertiaKV, Section 3).

Each rule combines the state ``m`` of an entry with a fresh score ``s``. With token
granularity the state is one vector over positions shared by all layers and updated layer
after layer inside a step, so under EMA layer l of K carries weight ``(1-a) a^(K-l)``.
Rules that adapt their own coefficient (App. H's selectors, ``methods.aggregators.adaptive``
and ``methods.aggregators.reactive``) also see each layer's fresh scores and the state after
each step.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from methods.base import SequenceInfo


class Aggregator(ABC):
    """A rule ``m <- f(m, s)``; states start at 0."""

    #: Whether the rule adapts from ``watch``/``end_step`` (it then needs the shared token state).
    adapts: ClassVar[bool] = False

    def begin(self, info: SequenceInfo) -> None:
        """Reset per-sequence state (only adaptive rules have any)."""

    @abstractmethod
    def combine(self, state: Tensor, score: Tensor) -> Tensor:
        """New state from the old state and a fresh score (same shapes)."""

    def fold(self, rows: Tensor, positions: Tensor, score: Tensor) -> None:
        """Combine ``score`` into the state ``rows`` at ``positions`` (both ``(rows, T)``), in place.

        ``combine`` between a gather and a scatter; a rule whose update needs fewer kernels overrides it,
        rounding exactly as ``combine`` does (a GPU's decode step pays per kernel, per layer)."""
        rows.scatter_(1, positions, self.combine(rows.gather(1, positions), score))

    def fold_layers(self, rows: Tensor, positions: Tensor, score: Tensor, layer: int, layers: int) -> None:
        """``fold`` into a state that each of a step's ``layers`` layers folds into in turn (token granularity),
        this being layer ``layer``'s: a rule may regroup the step's folds into fewer kernels, which rounds
        otherwise, so a method calls it only from ``SequenceInfo.numerics`` 3."""
        self.fold(rows, positions, score)

    def layer_coefficients(self, layers: int) -> tuple[float, tuple[float, ...]] | None:
        """``(d, c)`` when a step's folds of ``layers`` layers' scores into a state they share amount to
        ``m <- d * m + sum_l c[l] * s_l``, else None. A rule of that form lets a method fold the step's layers at
        once (``SequenceInfo.numerics`` 4), which rounds otherwise."""
        return None

    def watch(self, layer: int, positions: Tensor, score: Tensor) -> None:
        """One layer's fresh scores ``(rows, T)`` at ``positions`` during an observed step."""

    def end_step(self, step: int, positions: Tensor, state: Tensor, budget: int) -> None:
        """After observed decode step ``step``: the cached ``positions`` ``(1, T)``, their state, the budget."""

    def report(self) -> dict[str, float | None]:
        """What the rule decided for the current sequence (diagnostics)."""
        return {}


def add_scaled(rows: Tensor, positions: Tensor, score: Tensor, weight: float) -> None:
    """``rows[positions] += weight * score`` per row, rounding as the product then the sum. One row (a shared state)
    takes one kernel, which scales as it adds."""
    if rows.shape[0] == 1:
        rows[0].index_add_(0, positions[0], score[0], alpha=weight)
    else:
        rows.scatter_add_(1, positions, score if weight == 1.0 else weight * score)


@dataclass
class StepFold:
    """A step's layers folded at once into the state they share (``Aggregator.layer_coefficients``,
    ``SequenceInfo.numerics`` 4).

    Parameters:
        decay: the state's factor over the step, d.
        weights: each layer's coefficient c[l] times L, ``(L,)``: ``Scorer.layer_mean`` takes the layers' mean.
    """

    decay: float
    weights: Tensor

    def fold(self, rows: Tensor, positions: Tensor, mean: Tensor) -> None:
        """``rows <- d * rows``, then ``mean`` (``Scorer.layer_mean``'s, under ``weights``) added at ``positions``."""
        if self.decay != 1.0:
            rows.mul_(self.decay)
        add_scaled(rows, positions, mean, 1.0)


def top_positions(positions: Tensor, scores: Tensor, k: int) -> Tensor:
    """The positions of the ``k`` highest scores (1-D tensors over the same entries)."""
    return positions[scores.topk(min(k, scores.numel())).indices]


def top_k(budget: int, fraction: float) -> int:
    """The traced set size ``ceil(fraction * B)``, at least 1."""
    return max(1, math.ceil(fraction * budget - 1e-9))
