"""KVpop's training objective: teacher top-k at sampled query positions and a pairwise boundary loss.

At a query position ``q`` (after saturation: more than ``k`` candidates), the candidates are the
tokens ``s <= t <= q - w`` (neither sink nor in the recent window). Teacher and student rank them
with the same decay, ``score + floor((q - t) / n) log gamma_h``; the teacher keeps its top ``k``.
Each teacher-kept token is pushed above the teacher's first dropped token (the cutoff on the drop
side) and each dropped token below the teacher's last kept one, with ``softplus(-diff / tau)``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from methods.kvpop.policy import effective_score


def sample_queries(
    length: int, first: int, count: int, late_fraction: float, generator: torch.Generator, late_power: float = 2.0
) -> Tensor:
    """``count`` query positions in ``[first, length - 1]``: uniform, mixed with a late-biased share.

    A late-biased draw is ``first + floor(u ** (1 / late_power) * span)`` (density rising with the
    position): late queries see the most tokens and the longest eviction histories.
    """
    if first > length - 1:
        raise ValueError(f"no query position after saturation: need sequences longer than s + w + k = {first}")
    span = length - first
    uniform = torch.rand(count, generator=generator)
    late = torch.rand(count, generator=generator) ** (1.0 / late_power)
    use_late = torch.rand(count, generator=generator) < late_fraction
    draws = torch.where(use_late, late, uniform)
    return first + (draws * span).long().clamp_max(span - 1)


def candidates(queries: Tensor, length: int, sinks: int, window: int) -> Tensor:
    """``(Q, S)`` mask of the tokens evictable at each query: ``sinks <= t <= q - window``."""
    positions = torch.arange(length, device=queries.device)
    return (positions[None, :] >= sinks) & (positions[None, :] <= queries[:, None] - window)


def decayed(scores: Tensor, queries: Tensor, log_gamma: Tensor, bucket: int) -> Tensor:
    """``(..., Q, S)`` effective scores of ``scores (..., S)`` at each query, ``log_gamma (...)``."""
    positions = torch.arange(scores.shape[-1], device=scores.device)
    return effective_score(scores[..., None, :], positions, queries[:, None], log_gamma[..., None, None], bucket)


def top_k(scores: Tensor, mask: Tensor, k: int) -> Tensor:
    """Boolean mask of the ``k`` highest ``scores`` among ``mask`` per row (all of them if fewer)."""
    ranked = scores.masked_fill(~mask, -torch.inf).topk(min(k, scores.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(mask).scatter_(-1, ranked, True)
    return chosen & mask


def boundary_loss(
    student: Tensor, teacher: Tensor, mask: Tensor, k: int, temperature: float = 1.0, margin: float | None = 1.0
) -> Tensor:
    """Pairwise softplus loss against the teacher's cutoff tokens, keep/drop balanced; rows with
    at most ``k`` candidates are skipped.

    Per row (``(..., T)`` effective scores, ``mask`` the candidates): ``K`` = teacher top-k,
    ``D`` = the other candidates, ``c_K`` = the lowest teacher score in ``K``, ``c_D`` = the highest
    in ``D``. Keep term ``softplus((z_{c_D} - z_i) / tau)`` for ``i`` in ``K``, drop term
    ``softplus((z_j - z_{c_K}) / tau)`` for ``j`` in ``D``. Margin weights ``1 - exp(-|e - e_c| / margin)``
    (``e`` teacher scores) discount pairs the teacher itself barely separates (1 when ``margin``
    is None). The row loss is ``(weighted mean over K + weighted mean over D) / 2``, so the many
    dropped tokens do not drown the kept ones; the result is the mean over rows.
    """
    keep = top_k(teacher, mask, k)
    drop = mask & ~keep
    rows = drop.any(-1)
    teacher = teacher.detach()
    keep_cut = teacher.masked_fill(~keep, torch.inf).argmin(-1, keepdim=True)
    drop_cut = teacher.masked_fill(~drop, -torch.inf).argmax(-1, keepdim=True)

    def side(members: Tensor, cut: Tensor, sign: float) -> Tensor:
        gap = sign * (student - student.gather(-1, cut))
        teacher_gap = (sign * (teacher - teacher.gather(-1, cut))).clamp_min(0.0)
        weight = members.float() if margin is None else members * (1.0 - (-teacher_gap / margin).exp())
        losses = F.softplus(-gap / temperature).masked_fill(~members, 0.0)
        return (weight * losses).sum(-1) / weight.sum(-1).clamp_min(1e-8)

    per_row = 0.5 * (side(keep, drop_cut, 1.0) + side(drop, keep_cut, -1.0))
    return per_row[rows].mean() if rows.any() else student.sum() * 0.0


def retention_recall(student: Tensor, teacher: Tensor, mask: Tensor, k: int) -> Tensor:
    """Per row, the share of the teacher's top-k the student's top-k retains (rows past saturation)."""
    teacher_keep = top_k(teacher, mask, k)
    student_keep = top_k(student, mask, k)
    return (teacher_keep & student_keep).sum(-1) / teacher_keep.sum(-1).clamp_min(1)
