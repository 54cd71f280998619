"""Uniform random scores: the floor any informed scorer must beat."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.scorers.base import Scorer


@dataclass
class RandomScorer(Scorer):
    """Scores drawn from U(0, 1) with a generator seeded per sequence (reproducible)."""

    needs_attention = False
    order_free = False  # its draws follow the cache's order
    generator: torch.Generator = field(default_factory=torch.Generator, repr=False)

    def begin(self, info: SequenceInfo) -> None:
        self.generator = torch.Generator(device="cpu").manual_seed(info.seed)

    def score(self, view: LayerView) -> Tensor:
        drawn = torch.rand(view.positions.shape, generator=self.generator)
        return drawn.to(view.positions.device)
