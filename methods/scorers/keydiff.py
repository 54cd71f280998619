"""KeyDiff (Park et al. 2025, arXiv:2504.15364): keep keys that differ from the rest."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import Scorer


@dataclass
class KeyDiffScorer(Scorer):
    """Negative cosine similarity of each key to the mean key direction of its head."""

    needs_attention = False

    def score(self, view: LayerView) -> Tensor:
        keys = torch.nn.functional.normalize(view.keys.float(), dim=-1)
        anchor = torch.nn.functional.normalize(keys.mean(dim=1, keepdim=True), dim=-1)
        return -(keys * anchor).sum(dim=-1)
