"""Attention scaled by value norm (InertiaKV's VNorm variant; cf. Guo et al. 2024, arXiv:2406.12335)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.scorers.base import EntryNorms, Scorer, group_mean


@dataclass
class VNormScorer(Scorer):
    """``a_j * ||v_j|| / mean_i ||v_i||``: an entry matters by how much it moves the output."""

    order_free = False  # EntryNorms finds the entries it has not measured at the end of the cache
    norms: EntryNorms = field(default_factory=EntryNorms, init=False, repr=False, compare=False)

    def begin(self, info: SequenceInfo) -> None:
        self.norms.begin(info)

    def score(self, view: LayerView) -> Tensor:
        norms = self.norms(view, view.values)
        return group_mean(view) * norms / norms.mean(dim=-1, keepdim=True).clamp_min(1e-12)
