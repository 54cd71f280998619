"""KeyDiff (Park et al. 2025, arXiv:2504.15364): keep keys that differ from the rest."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import LayerView
from methods.scorers.base import NormScorer

# torch.nn.functional.normalize's floor on a norm.
_EPS = 1e-12


@dataclass
class KeyDiffScorer(NormScorer):
    """Negative cosine similarity of each key to the mean key direction of its head.

    With the key norms ``n_j`` measured once per entry, the anchor ``normalize(mean_j k_j / n_j)``
    and the cosines ``k_j . anchor / n_j`` are two products with the keys as cached: no per-step
    copy of the cache in fp32.
    """

    needs_attention = False

    def score(self, view: LayerView) -> Tensor:
        keys = view.keys
        inverse = 1.0 / self.norms(view, keys).clamp_min(_EPS)
        direction = torch.matmul(inverse[:, None, :].to(keys.dtype), keys)[:, 0].float() / keys.shape[1]
        anchor = torch.nn.functional.normalize(direction, dim=-1, eps=_EPS)
        return -torch.matmul(keys, anchor.to(keys.dtype)[:, :, None])[..., 0].float() * inverse
