"""Rotary position embedding (Su et al. 2021, arXiv:2104.09864) in the rotate-half layout transformers uses.

A vector at position p is rotated as ``x * cos_p + rotate_half(x) * sin_p``, where
``cos_p = scale * cos(p * inv_freq)`` repeated over both halves of the head dimension. The
engine hands methods the model's ``inv_freq`` and ``scale`` (``SequenceInfo``), so a method can
undo the rotation of a query it saw and apply that of positions not yet reached.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def cos_sin(positions: Tensor, inv_freq: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """``(len(positions), head_dim)`` cosines and sines of the rotation at ``positions``."""
    angles = positions.to(inv_freq.device, torch.float64)[:, None] * inv_freq.double()[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos() * scale, angles.sin() * scale


def unrotate(x: Tensor, positions: Tensor, inv_freq: Tensor, scale: float) -> Tensor:
    """``x`` ``(..., T, head_dim)`` rotated at ``positions`` ``(T,)``, back to its pre-RoPE form (float64)."""
    cos, sin = cos_sin(positions, inv_freq, scale)
    x = x.double()
    return (x * cos - rotate_half(x) * sin) / scale**2


def mean_rotation(positions: Tensor, inv_freq: Tensor, scale: float) -> Tensor:
    """The rotation matrix averaged over ``positions``: ``(head_dim, head_dim)``, acting on column vectors."""
    cos, sin = cos_sin(positions, inv_freq, scale)
    dim = cos.shape[-1]
    # rotate_half(x) = P x; rotate_half applied to the rows of the identity gives P transposed.
    half_turn = rotate_half(torch.eye(dim, dtype=torch.float64, device=cos.device)).T
    return torch.diag(cos.mean(dim=0)) + torch.diag(sin.mean(dim=0)) @ half_turn
