"""Decode-time eviction composed of scorer x aggregation x selection.

Every decode-time method in the papers is one composition (see ``conf/method/``): TOVA is
attention x single-step x per-layer; H2O is attention x cumulative x per-head with half the
budget as recent window; InertiaKV is attention x EMA(0.8) x token with shared state;
StreamingLLM is recency x single-step x token with four sinks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.aggregation import Aggregator
from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.options import require_int
from methods.prompt_attention import prompt_attention_votes
from methods.scorers.attention import AttentionScorer
from methods.scorers.base import Scorer
from methods.selection import Selection


@dataclass
class ScoredEviction(EvictionMethod):
    """Score entries at decode time, aggregate over steps, evict the lowest beyond the budget.

    The aggregated state lives over absolute positions, so eviction never has to realign it:
    ``(1, P)`` shared by all layers (token granularity), ``(layers, 1, P)`` or
    ``(layers, kv_heads, P)``. By default no scoring happens during the prefill; the cache may
    exceed the budget until the first decode step, which sees the whole prompt (InertiaKV,
    Sec. 3). With ``prefill_attention`` the prompt's own queries are a first observation and
    the cache is cut to the budget right after the prefill, as H2O's reference code does.

    Parameters:
        scorer: per-step signal (``methods.scorers``).
        aggregator: temporal rule (``methods.aggregation``).
        selection: budget, sinks, window, granularity.
        refresh_every: observe scores only on steps t with (t-1) mod r == 0 (InertiaKV Lazy-r);
            evict every step on the stale state.
        score_once: observe only at the first decode step and freeze the ranking (Score-Free).
        prefill_attention: observe the attention every prompt query pays each entry (summed over
            the queries) after the prefill, and evict then (H2O). Needs the attention scorer.
        name: label for records and tables.

    Entries inserted on a step without observation start at the mean state of the entries
    already cached (per row), so they are neither evicted at once nor kept forever.
    """

    scorer: Scorer
    aggregator: Aggregator
    selection: Selection
    refresh_every: int = 1
    score_once: bool = False
    prefill_attention: bool = False
    name: str = "scored"

    def __post_init__(self) -> None:
        require_int("method.refresh_every", self.refresh_every, minimum=1, example=4)
        if self.prefill_attention and not isinstance(self.scorer, AttentionScorer):
            raise ValueError(
                f"method.prefill_attention=true observes attention weights, which {type(self.scorer).__name__} "
                "does not score — use method/scorer=attention, or method.prefill_attention=false"
            )

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.selection.budget_for(info.prefill_len)
        capacity = info.prefill_len + info.max_new_tokens + 1
        rows = info.num_kv_heads if self.selection.granularity == "head" else 1
        layers = 1 if self.selection.granularity == "token" else info.num_layers
        self.state = torch.zeros(layers, rows, capacity, device=info.device)
        self.scorer.begin(info)

    def budget(self) -> int | None:
        return self._budget

    def observes(self, step: int) -> bool:
        if self._budget is None:
            return False
        if self.score_once:
            return step == 1
        return (step - 1) % self.refresh_every == 0

    def needs_attention(self, step: int) -> bool:
        return self.scorer.needs_attention and self.observes(step)

    def _state_rows(self, layer: int) -> Tensor:
        return self.state[0 if self.selection.granularity == "token" else layer]

    def _row_positions(self, positions: Tensor) -> Tensor:
        return positions if self.selection.granularity == "head" else positions[:1]

    @property
    def wants_prefill_queries(self) -> int:
        return self.info.prefill_len if self.prefill_attention and self._budget is not None else 0

    def observe_prefill(self, view: LayerView) -> None:
        self._combine(view, prompt_attention_votes(view))

    def observe(self, view: LayerView) -> None:
        self._combine(view, self.scorer.score(view))

    def _combine(self, view: LayerView, scores: Tensor) -> None:
        scores = scores.to(self.state.device, self.state.dtype)
        if self.selection.granularity != "head":
            scores = scores.mean(dim=0, keepdim=True)
        rows = self._state_rows(view.layer)
        positions = self._row_positions(view.positions)
        rows.scatter_(1, positions, self.aggregator.combine(rows.gather(1, positions), scores))

    def _init_newest(self, positions: list[Tensor], newest: int) -> None:
        layers = 1 if self.selection.granularity == "token" else len(positions)
        for layer in range(layers):
            rows = self._state_rows(layer)
            cached = self._row_positions(positions[layer])
            # The newest slot is still 0, so the row sum over the cache is the sum over the others.
            rows[:, newest] = rows.gather(1, cached).sum(dim=1) / max(cached.shape[1] - 1, 1)

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if self._budget is None or (step == 0 and not self.prefill_attention):
            return None
        newest = self.info.prefill_len + step - 1
        # At step 0 (prefill_attention) the newest entry is the last prompt token, already scored.
        if step > 0 and not self.observes(step):
            self._init_newest(positions, newest)
        if positions[0].shape[-1] <= self._budget:
            return None
        seen = newest + 1
        if self.selection.granularity == "token":
            cached = positions[0][:1]
            shared = self.selection.select(self.state[0].gather(1, cached), cached, seen, self._budget)[0]
            return [shared] * len(positions)
        plan = []
        for layer, layer_positions in enumerate(positions):
            cached = self._row_positions(layer_positions)
            chosen = self.selection.select(self._state_rows(layer).gather(1, cached), cached, seen, self._budget)
            plan.append(chosen if self.selection.granularity == "head" else chosen[0])
        return plan
