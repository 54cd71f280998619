"""Attention scaled by value norm (InertiaKV's VNorm variant; cf. Guo et al. 2024, arXiv:2406.12335)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import NormScorer, group_mean


@dataclass
class VNormScorer(NormScorer):
    """``a_j * ||v_j|| / mean_i ||v_i||``: an entry matters by how much it moves the output."""

    needs_attention = True

    def score(self, view: LayerView) -> Tensor:
        norms = self.norms(view, view.values)
        return group_mean(view) * norms / norms.mean(dim=-1, keepdim=True).clamp_min(1e-12)
