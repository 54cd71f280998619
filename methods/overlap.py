"""Set overlap of kept positions: the Jaccard index ``|a ∩ b| / |a ∪ b|``, two empty sets counting as identical (1).

The analysis compares retained sets read back from records (``jaccard``); the adaptive aggregators
compare top-k sets while decoding, as tensors that stay on the cache's device (``tensor_jaccard``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def jaccard(a: Iterable[int], b: Iterable[int]) -> float:
    """The Jaccard index of two collections of positions, taken as sets."""
    a, b = set(a), set(b)
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def tensor_jaccard(a: Tensor, b: Tensor) -> float:
    """The Jaccard index of two 1-D tensors of positions without repeats, with one read of the device."""
    shared = int(torch.isin(a, b).sum())
    union = a.numel() + b.numel() - shared
    return 1.0 if union == 0 else shared / union
