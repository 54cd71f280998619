"""What a scorer is: a per-step importance signal for every cached entry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor

from methods.base import LayerView, SequenceInfo


class Scorer(ABC):
    """Maps one layer's view to a score per KV head and entry, ``(kv_heads, T)``; higher = keep."""

    #: Whether the score reads ``view.weights`` (the engine then exposes the attention).
    needs_attention: ClassVar[bool] = True

    def begin(self, info: SequenceInfo) -> None:
        """Reset per-sequence state (only stochastic scorers have any)."""

    @abstractmethod
    def score(self, view: LayerView) -> Tensor:
        """Scores ``(kv_heads, T)`` for the entries of ``view``."""


def group_mean(view: LayerView) -> Tensor:
    """Attention of the current query, mean-pooled over each KV head's query group."""
    if view.weights is None:
        raise ValueError("this scorer needs attention weights, but the view carries none")
    return view.weights.float().mean(dim=1)
