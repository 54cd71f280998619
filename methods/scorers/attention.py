"""Last-query attention, the signal of TOVA, H2O and InertiaKV."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import Scorer, group_mean


@dataclass
class AttentionScorer(Scorer):
    """Softmax weight of the current query on each entry, mean over the query heads of a KV head."""

    needs_attention = True
    order_free = True
    rows = True

    def score(self, view: LayerView) -> Tensor:
        return group_mean(view)

    def pooled(self, view: LayerView) -> Tensor:
        # Every KV head's group has as many query heads: the mean over all of them is the mean of the groups' means.
        return group_mean(view, heads=(-3, -2)).unsqueeze(-2)

    def layer_mean(self, views: Sequence[LayerView], weights: Tensor) -> Tensor:
        # Every layer has as many query heads: one mean over layers and heads is the layers' mean of their pools.
        if any(view.weights is None for view in views):
            raise ValueError("this scorer needs attention weights, but a view carries none")
        stacked = torch.stack([view.weights for view in views], dim=-4)
        return (stacked * weights.view(-1, 1, 1, 1)).mean(dim=(-4, -3, -2)).unsqueeze(-2)
