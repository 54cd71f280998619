"""How KVpop ranks the eligible tokens of a KV head, and how a ranking is measured against the teacher's.

KVpop (arXiv 2607.05061), Eqs. 4-5 and 18-20: at query position ``q`` the eligible tokens are
``E(q) = {t | s <= t <= q - w}`` and rank by ``r_t + floor((q - t) / n) * log gamma_h``; the policy
keeps the top ``k`` of them. With ``n = 1`` the ranking equals sorting by the static priority
``r_t - t log gamma_h`` (Eq. 20), so a token never re-sorts once scored.
"""

from __future__ import annotations

import torch
from torch import Tensor


def effective_score(scores: Tensor, positions: Tensor, query: int | Tensor, log_gamma: Tensor, bucket: int) -> Tensor:
    """The paper's dynamic form ``r_hat + floor((q - t) / n) * log gamma`` (``log_gamma`` broadcasts over rows)."""
    ages = torch.div(query - positions, bucket, rounding_mode="floor")
    return scores + ages * log_gamma


def static_base(scores: Tensor, positions: Tensor, log_gamma: Tensor, bucket: int) -> Tensor:
    """The query-independent part of the priority, computed once when a token is scored.

    With ``q = a n + b`` and ``t = c n + d`` (``0 <= b, d < n``), ``floor((q - t) / n) = a - c - [d > b]``,
    so ``r(q) = a log gamma + (r_hat - c log gamma) - [d > b] log gamma``: the first term is shared by
    all tokens of a head and never changes the ranking.
    """
    return scores - torch.div(positions, bucket, rounding_mode="floor") * log_gamma


def static_priority(base: Tensor, positions: Tensor, query: int, log_gamma: Tensor, bucket: int) -> Tensor:
    """Ranking-equivalent to ``effective_score`` at ``query``: the base plus an age-bucket phase term.

    For ``n = 1`` the phase term is always 0: the priority is static and tokens never re-sort.
    """
    if bucket == 1:
        return base
    return base - ((positions % bucket) > (query % bucket)) * log_gamma


def candidates(queries: Tensor, length: int, sinks: int, window: int) -> Tensor:
    """``(Q, S)`` mask of the tokens eligible at each query (Eq. 4): ``sinks <= t <= q - window``."""
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


def retention_recall(student: Tensor, teacher: Tensor, mask: Tensor, k: int) -> Tensor:
    """Per row, the share of the teacher's top-k that the student's top-k retains (Fig. 7's recall)."""
    teacher_keep = top_k(teacher, mask, k)
    student_keep = top_k(student, mask, k)
    return (teacher_keep & student_keep).sum(-1) / teacher_keep.sum(-1).clamp_min(1)


def drop_times(priority: Tensor, sinks: int, window: int, k: int, chunk: int = 512) -> Tensor:
    """For every token, the first query position that no longer keeps it under the running top-k.

    ``priority`` ``(rows, S)`` static priorities; query ``q`` keeps, besides the sinks and the window
    ``[q - w, q]``, the ``k`` best of ``[s, q - 1 - w]`` (the cache the engine holds after step
    ``q - 1``). The candidate set only grows, so a token ``t`` stays kept from ``q = t + 1 + w`` until
    ``k`` better candidates exist; better = higher priority, ties to the earlier position (a stable
    descending sort). Returns ``(rows, S)`` query positions (``S``: kept to the end; ``t + 1 + w``:
    never kept). Appendix C finds the same cutoffs with a Fenwick tree over priority ranks; this
    dominance count is ``O(S^2)`` work but vectorised, in ``chunk``-token slices of memory.
    """
    rows, length = priority.shape
    index = torch.arange(length, device=priority.device)
    out = torch.full((rows, length), length, dtype=torch.long, device=priority.device)
    eligible = index >= sinks
    for start in range(0, length, chunk):
        tokens = index[start : start + chunk]
        mine = priority[:, tokens, None]
        others = priority[:, None, :]
        better = (others > mine) | ((others == mine) & (index[None, None, :] < tokens[None, :, None]))
        count = (better & eligible).cumsum(-1, dtype=torch.int32)  # better candidates among [0, u], per token
        reached = count >= k
        first = torch.where(reached.any(-1), reached.int().argmax(-1), length)
        # Candidate u enters the set at query u + 1 + w; a token is dropped once its k-th better one has.
        # Better tokens before t are already there when t itself enters, at t + 1 + w.
        entered = torch.maximum(first + 1 + window, tokens[None, :] + 1 + window)
        out[:, start : start + chunk] = entered.clamp_max(length)
    return out


def kept_mask(drop: Tensor, sinks: int, window: int) -> Tensor:
    """``(rows, S, S)`` boolean attention pattern of the running top-k with the given ``drop_times``."""
    length = drop.shape[-1]
    queries = torch.arange(length, device=drop.device)[:, None]
    keys = torch.arange(length, device=drop.device)[None, :]
    fixed = (keys <= queries) & ((keys < sinks) | (keys >= queries - window))
    chosen = (keys >= sinks) & (keys <= queries - 1 - window) & (queries[None] < drop[:, None, :])
    return fixed[None] | chosen
