"""Decode-time eviction composed of scorer x aggregation x selection.

Every decode-time method in the papers is one composition (see ``conf/method/``): TOVA is
attention x single-step x per-layer (cut at the prefill by the last prompt query, as the
InertiaKV paper ran it); H2O is attention x cumulative x per-head with half the budget as
recent window; InertiaKV is attention x EMA(0.8) x token with shared state; StreamingLLM is
recency x single-step x token with four sinks. InertiaKV's variants are parameters here:
Lazy-r (``refresh_every``), Score-Free (``score_once``), the first-eviction rescue of its
App. B (``rescue_fraction``; the static reserve is ``Selection.reserve_fraction``) and the
fixed target size with a compression interval of its App. D (``compress_every``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.aggregators.base import Aggregator, StepFold
from methods.base import EvictionMethod, KeepPlan, LayerView, Refill, RowStack, SequenceInfo
from methods.options import require_int, require_number
from methods.prompt_attention import prompt_attention_votes
from methods.scored_rows import ScoredRows
from methods.scorers.attention import AttentionScorer
from methods.scorers.base import Scorer
from methods.selection import Selection, exact_floor


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
        aggregator: temporal rule (``methods.aggregators``).
        selection: budget, sinks, window, granularity.
        refresh_every: observe scores only on steps t with (t-1) mod r == 0 (InertiaKV Lazy-r);
            evict every step on the stale state.
        score_once: observe only at the first decode step and freeze the ranking (Score-Free).
        prefill_attention: observe the attention every prompt query pays each entry (summed over
            the queries) after the prefill, and evict then (H2O). Needs the attention scorer.
        prefill_window: with ``prefill_attention``, only the last ``prefill_window`` prompt
            queries vote (0: every prompt query, H2O; 1: the last one, TOVA).
        decode_eviction: evict during decoding; ``false`` cuts the cache once after the prefill
            and lets it grow by the generated tokens (kvpress's prefill presses, which the
            InertiaKV paper ran its TOVA through).
        compress_every: evict only on decode steps t with t mod c == 0, back to the budget, so
            the cache grows by up to c - 1 entries in between (kvpress's DecodingPress
            ``compression_steps``, the compression interval of InertiaKV's Table 11).
        score_at_compression: with ``compress_every > 1``, observe only on the eviction steps
            (the scorer-at-compression reading) instead of every step.
        rescue_fraction: at the first eviction, ``floor(rescue_fraction * B)`` slots go to the
            entries the state would evict that score highest in any single layer, displacing the
            lowest-ranked survivors (InertiaKV App. B's first-eviction rescue).
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
    prefill_window: int = 0
    decode_eviction: bool = True
    compress_every: int = 1
    score_at_compression: bool = False
    rescue_fraction: float = 0.0
    name: str = "scored"

    def __post_init__(self) -> None:
        require_int("method.refresh_every", self.refresh_every, minimum=1, example=4)
        require_int("method.prefill_window", self.prefill_window, minimum=0, example=1)
        require_int("method.compress_every", self.compress_every, minimum=1, example=10)
        require_number("method.rescue_fraction", self.rescue_fraction, 0.1, minimum=0.0, maximum=1.0, open_max=True)
        if self.prefill_attention and not isinstance(self.scorer, AttentionScorer):
            raise ValueError(
                f"method.prefill_attention=true observes attention weights, which {type(self.scorer).__name__} "
                "does not score — use method/scorer=attention, or method.prefill_attention=false"
            )
        if not self.decode_eviction and not self.prefill_attention:
            raise ValueError(
                "method.decode_eviction=false without method.prefill_attention=true never evicts"
                " — set method.prefill_attention=true (evict once after the prefill), or method.decode_eviction=true"
            )
        if self.aggregator.adapts and self.selection.granularity != "token":
            raise ValueError(
                f"method/aggregator={type(self.aggregator).__name__} adapts alpha from the state shared by all"
                f" layers, not method.selection.granularity={self.selection.granularity!r} — use granularity=token"
            )
        if self.prefill_window and not self.prefill_attention:
            raise ValueError(
                f"method.prefill_window={self.prefill_window} chooses prompt queries, which only"
                " method.prefill_attention=true observes — set it, or method.prefill_window=0"
            )

    def check(self, info: SequenceInfo) -> int | None:
        budget = self.selection.budget_for(info.prefill_len)
        rescue = 0 if budget is None else exact_floor(self.rescue_fraction * budget)
        if rescue:
            protected = self.selection.sinks + self.selection.recent(budget)
            protected += exact_floor(self.selection.reserve_fraction * budget)
            if protected > budget - rescue:
                raise ValueError(
                    f"method.rescue_fraction={self.rescue_fraction} takes {rescue} of B={budget} slots,"
                    f" leaving fewer than the {protected} protected entries — lower it, or shrink the protection"
                )
        return budget

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        capacity = info.prefill_len + info.max_new_tokens + 1
        rows = info.num_kv_heads if self.selection.granularity == "head" else 1
        layers = 1 if self.selection.granularity == "token" else info.num_layers
        self.state = torch.zeros(layers, rows, capacity, device=info.device)
        self.scorer.begin(info)
        self.aggregator.begin(info)
        self._rescue = 0 if self._budget is None else exact_floor(self.rescue_fraction * self._budget)
        if self._rescue:
            # Each entry's highest single-layer score until the first eviction.
            self.peak = torch.zeros_like(self.state)
        self._evicted = False
        self._pending: list[LayerView] = []
        self._step_fold = self._layer_fold(info)
        self._reserved = None
        if self._budget is not None:
            self._reserved = self.selection.reserved(self._budget, info.prefill_len, capacity, info.device)

    def budget(self) -> int | None:
        return self._budget

    @property
    def order_free(self) -> bool:
        # The state lives over absolute positions; only the scorer may read the cache's order.
        return self.scorer.order_free

    def _compresses(self, step: int) -> bool:
        return step % self.compress_every == 0

    def observes(self, step: int) -> bool:
        if self._budget is None or not self.decode_eviction:
            return False
        if not self.score_once and self.score_at_compression and not self._compresses(step):
            return False
        return self._scheduled(step)

    def _scheduled(self, step: Tensor | int) -> Tensor | bool:
        """Score-Free's first step, or Lazy-r's every r-th: for one step, or a stack's rows' steps as a tensor (whose
        steady state has no compression interval, so this is all of ``observes``)."""
        return step == 1 if self.score_once else (step - 1) % self.refresh_every == 0

    def needs_attention(self, step: int) -> bool:
        return self.scorer.needs_attention and self.observes(step)

    def _state_rows(self, layer: int) -> Tensor:
        return self.state[0 if self.selection.granularity == "token" else layer]

    def _row_positions(self, positions: Tensor) -> Tensor:
        return positions if self.selection.granularity == "head" else positions[:1]

    @property
    def wants_prefill_queries(self) -> int:
        if not self.prefill_attention or self._budget is None:
            return 0
        return min(self.prefill_window or self.info.prefill_len, self.info.prefill_len)

    def observe_prefill(self, view: LayerView) -> None:
        self._combine(view, prompt_attention_votes(view))

    def keep_prefill_layer(self, layer: int, positions: Tensor) -> Tensor | None:
        """A per-layer or per-head keep set depends on its own layer's votes only, so the layer is cut
        inside the prefill forward, as kvpress's presses do: the whole prompt never sits in every
        layer at once (the paper's TOVA has a lower prefill peak than InertiaKV for this reason).
        The token-level set needs every layer's votes, so it waits for ``keep(0)``."""
        if self.selection.granularity == "token" or positions.shape[-1] <= self._budget:
            return None
        chosen = self._select(layer, self._row_positions(positions), self.info.prefill_len)
        return chosen if self.selection.granularity == "head" else chosen[0]

    @property
    def _regrouped(self) -> bool:
        """Whether the arithmetic is regrouped into fewer kernels (``SequenceInfo.numerics``)."""
        return self.info.numerics >= 3

    def _layer_fold(self, info: SequenceInfo) -> StepFold | None:
        """Under ``numerics`` 4, a state shared by every layer (token granularity) under a rule linear in it
        (``Aggregator.layer_coefficients``) takes a step's layers at once."""
        if info.numerics < 4 or self.selection.granularity != "token":
            return None
        coefficients = self.aggregator.layer_coefficients(info.num_layers)
        if coefficients is None:
            return None
        decay, weights = coefficients
        return StepFold(decay, torch.tensor([weight * info.num_layers for weight in weights], device=info.device))

    def observe(self, view: LayerView) -> None:
        if self._step_fold is not None and not (self._rescue and not self._evicted):
            # The layers' views wait for the last: one pass over all of them, one fold (a rescue's per-layer
            # peaks need each layer's own scores).
            self._pending.append(view)
            if view.layer == self.info.num_layers - 1:
                views, self._pending = self._pending, []
                scores = self.scorer.layer_mean(views, self._step_fold.weights).to(self.state.device, self.state.dtype)
                self._step_fold.fold(self.state[0], self._row_positions(view.positions), scores)
        elif self.selection.granularity != "head" and self._regrouped:
            self._combine(view, self.scorer.pooled(view), pooled=True)
        else:
            self._combine(view, self.scorer.score(view))

    def _combine(self, view: LayerView, scores: Tensor, pooled: bool = False) -> None:
        scores = scores.to(self.state.device, self.state.dtype)
        if self.selection.granularity != "head" and not pooled:
            scores = scores.mean(dim=0, keepdim=True)
        rows = self._state_rows(view.layer)
        positions = self._row_positions(view.positions)
        self.aggregator.watch(view.layer, positions, scores)
        if self.selection.granularity == "token" and self._regrouped:
            self.aggregator.fold_layers(rows, positions, scores, view.layer, self.info.num_layers)
        else:
            self.aggregator.fold(rows, positions, scores)
        if self._rescue and not self._evicted:
            peak = self.peak[0 if self.selection.granularity == "token" else view.layer]
            peak.scatter_(1, positions, torch.maximum(peak.gather(1, positions), scores))

    def keep_shape(self) -> tuple[int, int]:
        granularity = self.selection.granularity
        layers = 1 if granularity == "token" else self.info.num_layers
        return layers, self.info.num_kv_heads if granularity == "head" else 1

    def _table(self, positions: list[Tensor]) -> Tensor:
        """The per-layer positions as the steady table ``(layers', rows, T)`` (``keep_shape``)."""
        if self.selection.granularity == "token":
            return positions[0][None, :1]
        return torch.stack([self._row_positions(layer) for layer in positions])

    def steady(self) -> bool:
        # A compression interval, an adaptive alpha (host logic at every observed step) or a pending
        # first-eviction rescue leave the loop; so does a scorer that reads the cache's order.
        return (
            self._budget is not None
            and self.info.refill
            and self.decode_eviction
            and self.compress_every == 1
            and self.scorer.order_free
            and not self.aggregator.adapts
            and (not self._rescue or self._evicted)
        )

    def stack(self, methods: list[EvictionMethod], steps: list[int]) -> RowStack | None:
        # Equal options (a dataclass compares its fields, not the state ``begin`` makes) and a scorer that
        # takes stacked rows; ``steady`` already ruled out what reads the host or the cache's order.
        alike = all(type(method) is type(self) and method == self and method.steady() for method in methods)
        if not (alike and self.scorer.rows):
            return None
        states, budgets = [method.state for method in methods], [method._budget for method in methods]
        reserved = [method._reserved for method in methods]
        return ScoredRows(
            states, budgets, reserved, steps, self._scheduled, self.selection, self.scorer, self.aggregator,
            self.info.num_layers, self._regrouped, self._step_fold,
        )  # fmt: skip

    def evict_one(self, positions: Tensor, seen: Tensor | int, observed: bool) -> Tensor:
        if not observed:
            self._init_newest(positions, seen - 1)
        priority = self.state.gather(2, positions)
        return self.selection.evict_one(priority, positions, seen, self._budget, self._reserved)

    def _init_newest(self, table: Tensor, newest: Tensor | int) -> None:
        """Give the newest entry (not observed at this step) the mean state of the others, per row."""
        # The newest slot is still 0, so the row sum over the cache is the sum over the others.
        mean = self.state.gather(2, table).sum(dim=2, keepdim=True) / max(table.shape[-1] - 1, 1)
        at = torch.as_tensor(newest, device=table.device).view(1, 1, 1).expand_as(mean)
        self.state.scatter_(2, at, mean)

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if self._budget is None or (step == 0 and not self.prefill_attention):
            return None
        if step > 0 and not self.decode_eviction:
            return None
        seen = self.info.prefill_len + step
        observed = step > 0 and self.observes(step)
        one = self.info.refill and not (self._rescue and not self._evicted) and not isinstance(positions[0], tuple)
        one = one and step > 0 and self._compresses(step) and positions[0].shape[-1] == self._budget + 1
        if one:
            # One entry per row goes: the steady step's own choice, given as the slot each row gives up.
            if observed:
                cached = positions[0][:1]
                self.aggregator.end_step(step, cached, self.state[0].gather(1, cached), self._budget)
            slots = self.evict_one(self._table(positions), seen, observed)
            self._evicted = True
            return [Refill(slots[layer if slots.shape[0] > 1 else 0]) for layer in range(len(positions))]
        # At step 0 (prefill_attention) the newest entry is the last prompt token, already scored.
        if step > 0 and not observed:
            self._init_newest(self._table(positions), seen - 1)
        if observed:
            cached = positions[0][:1]
            self.aggregator.end_step(step, cached, self.state[0].gather(1, cached), self._budget)
        if (step > 0 and not self._compresses(step)) or positions[0].shape[-1] <= self._budget:
            self._evicted = self._evicted or step == 0
            return None
        if self.selection.granularity == "token":
            cached = positions[0][:1]
            shared = self._select(0, cached, seen)[0]
            plan = [shared] * len(positions)
        else:
            rows = [self._row_positions(layer_positions) for layer_positions in positions]
            if len({row.shape for row in rows}) == 1 and not (self._rescue and not self._evicted):
                # Every layer holds the same count: one selection over all layers at once.
                stacked = torch.stack(rows)
                priority = self.state.gather(2, stacked)
                chosen = self.selection.select(priority, stacked, seen, self._budget, self._reserved)
                per_layer = list(chosen.unbind(0))
            else:
                per_layer = [self._select(layer, row, seen) for layer, row in enumerate(rows)]
            plan = per_layer if self.selection.granularity == "head" else [chosen[0] for chosen in per_layer]
        self._evicted = True
        return plan

    def _select(self, layer: int, cached: Tensor, seen: int) -> Tensor:
        priority = self._state_rows(layer).gather(1, cached)
        if not self._rescue or self._evicted:
            return self.selection.select(priority, cached, seen, self._budget, self._reserved)
        main = self.selection.select(priority, cached, seen, self._budget - self._rescue, self._reserved)
        peak = self.peak[0 if self.selection.granularity == "token" else layer].gather(1, cached)
        rescued = peak.scatter(1, main, -torch.inf).topk(self._rescue, dim=-1).indices
        return torch.cat([main, rescued], dim=-1).sort(dim=-1).values
