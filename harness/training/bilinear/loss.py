"""The bilinear scorer's objective and its held-out agreement with attention (InertiaKV §5.1).

Teacher: at a query position, the model's attention over the entries up to it, averaged over the
query heads (the per-step signal InertiaKV aggregates). Student: the softmax at temperature
``tau`` of the bilinear logits over the same entries. The loss is ``MSE + lambda * KL``: the
squared difference of the two distributions summed over entries (reading: the paper names
"MSE" without its normalisation; summing over entries keeps it on the scale of the KL term),
plus ``KL(teacher || student)``, both averaged over query rows (paper: lambda = 0.1, tau = 1.0).
"""

from __future__ import annotations

import math

import torch
from scipy import stats
from torch import Tensor


def causal_mask(rows: Tensor, length: int) -> Tensor:
    """``(len(rows), length)``: True where entry j is visible to the query at position ``rows[i]`` (j <= rows[i])."""
    return torch.arange(length, device=rows.device)[None, :] <= rows[:, None]


def teacher_attention(queries: Tensor, keys: Tensor, rows: Tensor, scaling: float) -> Tensor:
    """``(len(rows), T)`` attention of the queries at ``rows``, mean over query heads (``queries`` ``(H, T, D)``)."""
    kv_heads, length, dim = keys.shape
    grouped = queries[:, rows].view(kv_heads, -1, len(rows), dim)
    logits = torch.matmul(grouped, keys.transpose(-1, -2)[:, None]) * scaling
    logits = logits.masked_fill(~causal_mask(rows, length), -torch.inf)
    return logits.softmax(dim=-1).mean(dim=(0, 1))


def distillation_loss(logits: Tensor, teacher: Tensor, visible: Tensor, kl_weight: float, tau: float) -> Tensor:
    """``MSE + kl_weight * KL(teacher || softmax(logits / tau))`` over visible entries, mean over rows."""
    log_student = (logits / tau).masked_fill(~visible, -torch.inf).log_softmax(dim=-1)
    student = log_student.exp()
    squared = ((student - teacher) ** 2).sum(dim=-1)
    kl = torch.where(teacher > 0, teacher * (teacher.clamp_min(1e-30).log() - log_student), 0.0).sum(dim=-1)
    return (squared + kl_weight * kl).mean()


def agreement(scores: Tensor, reference: Tensor, fraction: float) -> tuple[float, float]:
    """Spearman correlation and Jaccard of the top ``ceil(fraction * T)`` sets of two ``(T,)`` score vectors."""
    spearman = float(stats.spearmanr(scores.numpy(), reference.numpy()).statistic)
    size = max(1, math.ceil(fraction * scores.numel()))
    top = set(scores.topk(size).indices.tolist())
    reference_top = set(reference.topk(size).indices.tolist())
    return spearman, len(top & reference_top) / len(top | reference_top)
