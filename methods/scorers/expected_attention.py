"""Expected Attention (Devoto et al. 2025, arXiv:2510.00636): the attention future queries are expected to pay.

Future queries are modelled as Gaussian, per query head, with the mean ``mu`` and covariance
``Sigma`` of the pre-RoPE queries seen so far, rotated by the RoPE rotation averaged over the
next ``future`` positions (``R``): ``mu' = R mu``, ``Sigma' = R Sigma R^T``. For a Gaussian
query, ``E[exp(s q.k)] = exp(s mu'.k + s^2 k^T Sigma' k / 2)``, so an entry's expected logit is
``s mu'.k + s^2 k^T Sigma' k / 2`` (``s`` the softmax scale); the softmax over the entries,
averaged over a KV head's query group, times ``||v|| + epsilon``, is the score. Defaults follow
kvpress's ``ExpectedAttentionPress``: 512 future positions, covariance and value norm on, the
first 4 entries (``sinks``) left out of the softmax and their queries out of the statistics.

The statistics accumulate every query the scorer is shown (the prompt's, then each decode
step's), per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.options import require_int, require_number
from methods.rope import mean_rotation, unrotate
from methods.scorers.base import Scorer


@dataclass
class QueryStatistics:
    """Running first and second moments of one layer's pre-RoPE queries, per query head (float64)."""

    count: int
    total: Tensor
    outer: Tensor

    @classmethod
    def empty(cls, heads: int, dim: int, device: torch.device) -> QueryStatistics:
        zeros = torch.zeros(heads, dim, dtype=torch.float64, device=device)
        return cls(0, zeros, torch.zeros(heads, dim, dim, dtype=torch.float64, device=device))

    def add(self, queries: Tensor) -> None:
        """Add ``(heads, n, dim)`` queries."""
        self.count += queries.shape[1]
        self.total += queries.sum(dim=1)
        self.outer += queries.transpose(1, 2) @ queries

    def mean(self) -> Tensor:
        return self.total / self.count

    def covariance(self) -> Tensor:
        """Biased (divided by n), as kvpress computes it."""
        mean = self.mean()
        return self.outer / self.count - mean[:, :, None] * mean[:, None, :]


@dataclass
class ExpectedAttentionScorer(Scorer):
    """Expected attention of future queries on each entry, times the value norm.

    Parameters:
        future: future positions the RoPE rotation is averaged over (kvpress: 512).
        covariance: include the query covariance term (False: the mean query only).
        value_norm: multiply by ``||v||`` (plus ``epsilon``).
        epsilon: added to the expected attention before the value norm.
        sinks: the first entries, left out of the softmax (scored 0; the selection keeps them)
            and whose queries are left out of the statistics (outliers).
    """

    needs_attention: ClassVar[bool] = False
    order_free: ClassVar[bool] = True  # one logit per entry, softmaxed over the entries in whatever order
    #: Scores ragged layers (``PerHead`` views), as a per-head budget produces.
    scores_ragged: ClassVar[bool] = True

    future: int = 512
    covariance: bool = True
    value_norm: bool = True
    epsilon: float = 0.0
    sinks: int = 4

    def __post_init__(self) -> None:
        require_int("method.scorer.future", self.future, minimum=1, example=512)
        require_int("method.scorer.sinks", self.sinks, minimum=0, example=4)
        require_number("method.scorer.epsilon", self.epsilon, 0.0, minimum=0.0)

    def begin(self, info: SequenceInfo) -> None:
        self.info = info
        self._statistics: dict[int, QueryStatistics] = {}

    def _observe_queries(self, view: LayerView, newest: int) -> QueryStatistics:
        if self.info.rope_inv_freq is None:
            raise ValueError(
                "Expected Attention rotates queries to future positions, but this model gives no RoPE frequencies "
                "— use it on a RoPE model run by the engine"
            )
        heads, count, dim = view.queries.shape
        statistics = self._statistics.get(view.layer)
        if statistics is None:
            statistics = self._statistics[view.layer] = QueryStatistics.empty(heads, dim, view.queries.device)
        positions = torch.arange(newest - count + 1, newest + 1, device=view.queries.device)
        wanted = positions >= self.sinks
        if wanted.any():
            inv_freq = self.info.rope_inv_freq.to(view.queries.device)
            statistics.add(unrotate(view.queries[:, wanted], positions[wanted], inv_freq, self.info.rope_scale))
        return statistics

    def _future_query(self, statistics: QueryStatistics, seen: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The rotated mean ``(H, D)`` and covariance ``(H, D, D)`` of the queries of the next positions."""
        future = torch.arange(seen, seen + self.future, device=device)
        rotation = mean_rotation(future, self.info.rope_inv_freq.to(device), self.info.rope_scale)
        mean = statistics.mean() @ rotation.T
        covariance = rotation @ statistics.covariance() @ rotation.T if self.covariance else None
        return mean, covariance

    def score(self, view: LayerView) -> Tensor | tuple[Tensor, ...]:
        ragged = isinstance(view.positions, tuple)
        rows = view.positions if ragged else view.positions.unbind(0)
        keys = view.keys if ragged else view.keys.unbind(0)
        values = view.values if ragged else view.values.unbind(0)
        newest = view.seen - 1 if view.seen is not None else max(int(row.max()) for row in rows)
        statistics = self._observe_queries(view, newest)
        if statistics.count == 0:
            scores = tuple(torch.zeros(row.shape, device=row.device) for row in rows)
            return scores if ragged else torch.stack(scores)
        mean, covariance = self._future_query(statistics, newest + 1, view.queries.device)
        group = mean.shape[0] // len(rows)
        scores = []
        for head, (positions, key, value) in enumerate(zip(rows, keys, values, strict=True)):
            key = key.double()
            queries = slice(head * group, (head + 1) * group)
            logits = mean[queries] @ key.T * view.scaling
            if covariance is not None:
                spread = torch.einsum("td,gde,te->gt", key, covariance[queries], key)
                logits = logits + 0.5 * view.scaling**2 * spread
            scored = positions >= self.sinks
            attention = torch.zeros_like(logits)
            attention[:, scored] = logits[:, scored].softmax(dim=-1)
            score = attention.mean(dim=0)
            if self.value_norm:
                score = (score + self.epsilon) * value.double().norm(dim=-1)
            scores.append(score.masked_fill(~scored, 0.0).float())
        return tuple(scores) if ragged else torch.stack(scores)
