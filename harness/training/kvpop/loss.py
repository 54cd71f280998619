"""KVpop's training objective: teacher decisions at sampled query positions and the pairwise boundary loss.

KVpop (arXiv 2607.05061), Sec. 3.1 and App. B. At a query position ``q`` after saturation
(``q >= s + w + k``, Eq. 25) the token ``t_new = q - w`` has just become eligible (Eq. 4). Teacher
and student rank the eligible tokens with the same decay, ``score + floor((q - t) / n) log gamma_h``
(Eq. 5). The teacher's label ``y`` says whether ``t_new`` is retained (Eq. 6) and ``t_bnd`` is the
token at its cutoff; the loss is ``w * softplus(-y (z_new - z_bnd) / tau)`` on the student's
effective scores ``z`` (Eq. 7), with the margin weight of Eq. 23 and the keep/drop balance of Eq. 24.

Reading of ``t_bnd`` (the paper: "the last retained token under the teacher ranking"):
``boundary=displaced`` (default) takes the ``k``-th best of the *other* eligible tokens, the one
``t_new`` displaces when kept and which stays kept when ``t_new`` is dropped: both labels then
compare ``t_new`` with the token it actually competes with. ``boundary=last_kept`` takes the
``k``-th of all eligible tokens, ``t_new`` included, which is ``t_new`` itself when it enters last
(a zero-margin pair). For ``y = -1`` the two coincide.

``cutoff_loss`` is the objective of the earlier scorer-only recipe: every candidate against the
teacher's cutoff on its side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from methods.kvpop.ranking import top_k

BOUNDARIES = ("displaced", "last_kept")


def sample_queries(
    length: int, first: int, count: int, late_fraction: float, generator: torch.Generator, late_power: float = 2.0
) -> Tensor:
    """``count`` query positions in ``[first, length - 1]``: uniform, mixed with a late-biased share (App. B.6).

    A late-biased draw is ``first + floor(u ** (1 / late_power) * span)`` (density rising with the
    position): late queries see the most tokens and the longest eviction histories.
    """
    if first > length - 1:
        raise ValueError(
            f"no query position after saturation: the training windows of {length} tokens are not longer than "
            f"s + w + k = {first} — raise data.length or lower kvpop.budget"
        )
    span = length - first
    uniform = torch.rand(count, generator=generator)
    late = torch.rand(count, generator=generator) ** (1.0 / late_power)
    use_late = torch.rand(count, generator=generator) < late_fraction
    draws = torch.where(use_late, late, uniform)
    return first + (draws * span).long().clamp_max(span - 1)


@dataclass(frozen=True)
class Weighting:
    """The optional weights of Eq. 7 (App. B.4-B.5).

    Parameters:
        margin_min: ``omega_min`` of Eq. 23 (None: no margin weight).
        margin_tau: ``tau_omega``, the sharpness of Eq. 23.
        balance: keep/drop balancing per head (Eq. 24).
        balance_min, balance_max: ``c_min``, ``c_max``, the clip of Eq. 24.
    """

    margin_min: float | None = 0.1
    margin_tau: float = 1.0
    balance: bool = True
    balance_min: float = 0.1
    balance_max: float = 10.0


@dataclass
class Decisions:
    """The teacher's boundary decisions at sampled queries, flattened over ``(rows, Q)``.

    ``label`` is +1 when ``t_new`` is retained, -1 when dropped; ``new``/``boundary`` index the two
    tokens of each pair along the sequence; ``margin`` is Eq. 22's ``Delta >= 0``; ``head`` the row.
    """

    label: Tensor
    new: Tensor
    boundary: Tensor
    margin: Tensor
    head: Tensor


def teacher_decisions(teacher: Tensor, mask: Tensor, queries: Tensor, window: int, k: int, boundary: str) -> Decisions:
    """Eq. 6 and the cutoff token at each query, from the teacher's effective scores ``(rows, Q, S)``.

    ``mask`` ``(Q, S)`` marks the eligible tokens; every query must have at least ``k + 1`` of them.
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"train.boundary={boundary!r} is not a reading of t_bnd — use one of {', '.join(BOUNDARIES)}")
    rows, count, _ = teacher.shape
    new = (queries - window)[None, :].expand(rows, -1)
    teacher = teacher.detach()
    pool = mask.clone()
    if boundary == "displaced":
        pool[torch.arange(count), queries - window] = False
    pool = pool.expand_as(teacher)
    # The k-th best of the pool: the lowest of its top-k.
    ranked = teacher.masked_fill(~pool, -torch.inf).topk(k, dim=-1)
    cut = ranked.indices[..., -1]
    new_score = teacher.gather(-1, new[..., None])[..., 0]
    cut_score = ranked.values[..., -1]
    if boundary == "displaced":
        label = torch.where(new_score > cut_score, 1.0, -1.0)
    else:
        label = torch.where(top_k(teacher, mask.expand_as(teacher), k).gather(-1, new[..., None])[..., 0], 1.0, -1.0)
    head = torch.arange(rows, device=teacher.device)[:, None].expand(-1, count)
    return Decisions(
        label.flatten(),
        new.flatten(),
        cut.flatten(),
        (label * (new_score - cut_score)).clamp_min(0.0).flatten(),
        head.flatten(),
    )


def decision_weights(decisions: Decisions, rows: int, weighting: Weighting) -> Tensor:
    """``omega`` of Eq. 7: the margin weight (Eq. 23) times the mean-normalised balance weight (Eq. 24)."""
    weight = torch.ones_like(decisions.margin)
    if weighting.margin_min is not None:
        low = weighting.margin_min
        weight = low + (1.0 - low) * torch.sigmoid(decisions.margin / weighting.margin_tau)
    if weighting.balance:
        keep = decisions.label > 0
        kept = torch.zeros(rows, device=weight.device).index_add_(0, decisions.head, keep.float())
        total = torch.zeros(rows, device=weight.device).index_add_(0, decisions.head, torch.ones_like(weight))
        share = (kept / total.clamp_min(1))[decisions.head]
        raw = torch.where(keep, 1.0 / (2.0 * share), 1.0 / (2.0 * (1.0 - share)))
        balance = raw.clamp(weighting.balance_min, weighting.balance_max)
        weight = weight * balance / balance.mean()
    return weight


def boundary_loss(
    student: Tensor,
    teacher: Tensor,
    mask: Tensor,
    queries: Tensor,
    window: int,
    k: int,
    temperature: float = 1.0,
    weighting: Weighting = Weighting(),
    boundary: str = "displaced",
) -> Tensor:
    """Eq. 7 over the sampled queries: ``mean(omega * softplus(-y (z_new - z_bnd) / tau))``.

    ``student`` and ``teacher`` are effective scores ``(rows, Q, S)`` (rows: KV heads, of one or
    several layers), ``mask`` ``(Q, S)`` the eligible tokens, ``queries`` ``(Q,)`` the positions.
    """
    decisions = teacher_decisions(teacher, mask, queries, window, k, boundary)
    flat = student.reshape(-1, student.shape[-1])
    z_new = flat.gather(-1, decisions.new[:, None])[:, 0]
    z_bnd = flat.gather(-1, decisions.boundary[:, None])[:, 0]
    weight = decision_weights(decisions, student.shape[0], weighting)
    return (weight * F.softplus(-decisions.label * (z_new - z_bnd) / temperature)).mean()


def cutoff_loss(
    student: Tensor, teacher: Tensor, mask: Tensor, k: int, temperature: float = 1.0, margin: float | None = 1.0
) -> Tensor:
    """The scorer-only recipe's loss: every candidate against the teacher's cutoff, keep/drop balanced;
    rows with at most ``k`` candidates are skipped.

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
