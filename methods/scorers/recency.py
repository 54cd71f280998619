"""Recency: newer entries first (with sinks, StreamingLLM; Xiao et al. 2023, arXiv:2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import Scorer


@dataclass
class RecencyScorer(Scorer):
    """The absolute position itself."""

    needs_attention = False
    order_free = True  # it reads the absolute positions, not the slots

    def score(self, view: LayerView) -> Tensor:
        return view.positions.float()
