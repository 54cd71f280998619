"""Attention weighted by how focused the layer is (InertiaKV's entropy variant)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import Scorer, group_mean


@dataclass
class EntropyScorer(Scorer):
    """``a_j * (1 - H(a) / log T)``, one scalar per layer.

    Diffuse layers (entropy near log T) carry little information about which entry matters,
    so under shared token-level state they contribute less than sharply focused layers.
    """

    needs_attention = True
    order_free = True  # the entropy sums over the entries, in whatever order they sit

    def score(self, view: LayerView) -> Tensor:
        attention = group_mean(view)
        length = attention.shape[-1]
        if length < 2:
            return attention
        entropy = -(attention * attention.clamp_min(1e-12).log()).sum(dim=-1).mean()
        return attention * (1.0 - entropy / math.log(length)).clamp_min(0.0)
