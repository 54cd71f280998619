"""Key norm (Devoto et al. 2024, arXiv:2406.11430): low-norm keys draw high attention."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import NormScorer


@dataclass
class KeyNormScorer(NormScorer):
    """``-||k_j||``."""

    needs_attention = False

    def score(self, view: LayerView) -> Tensor:
        return -self.norms(view, view.keys)
