"""Key norm (Devoto et al. 2024, arXiv:2406.11430): low-norm keys draw high attention."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.scorers.base import EntryNorms, Scorer


@dataclass
class KeyNormScorer(Scorer):
    """``-||k_j||``."""

    needs_attention = False
    order_free = False  # EntryNorms finds the entries it has not measured at the end of the cache
    norms: EntryNorms = field(default_factory=EntryNorms, init=False, repr=False, compare=False)

    def begin(self, info: SequenceInfo) -> None:
        self.norms.begin(info)

    def score(self, view: LayerView) -> Tensor:
        return -self.norms(view, view.keys)
