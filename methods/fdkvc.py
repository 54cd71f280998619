"""FD-KVC (Fractional Decay KV-Cache, arXiv 2608.18098): ownership-aware eviction for dialogs.

Every cached entry carries a cumulative-attention channel ``c``
(H2O-like) and a recency-relevance channel ``recency`` that forgets by ``gamma`` per turn and is
reinforced by the entry's affinity to the turn's mean query, at a rate that slows down when
the cache's ownership is uncertain. Eviction ranks by the hybrid ``h``; the kept entries'
attention is modulated by ``(0.5 + 0.5 * recency_hat) ** beta``, applied as an additive logit bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.options import require_int, require_number
from methods.selection import Selection

RELEVANCE_NORMS = ("relu", "affine", "max")


@dataclass
class FDKVC(EvictionMethod):
    """FD-KVC (arXiv 2608.18098): hybrid cumulative-attention / recency-relevance eviction.

    Per cached entry (state over absolute positions, like ``ScoredEviction``):

    - ``c``: cumulative attention (mean over a KV head's query group); every entry starts at
      ``c = 1`` when it enters the cache. At each turn end the turn's mean attention is added
      (per-turn update, the paper's unit of time); ``c_every_step=True`` adds every decode
      step's attention instead (H2O's rule, which lets old entries outgrow new ones by
      ``turn_length`` times more per turn).
    - ``recency``: the recency-relevance channel (the paper's ρ), starts at 1; at every turn end
      ``recency <- clip(gamma * recency + alpha_t * s, 0, 1)`` with ``s`` the normalised cosine between
      the entry's key and the turn's mean query, and ``alpha_t = alpha0 / (1 + mu * L_t)``,
      ``L_t = mean(h_hat * (1 - h_hat))`` the ownership loss of the cache before the update
      (``h_hat = h / max h``).
    - ``h = w_c * c / max(c) + w_recency * recency``; entries with ``h < tau * max(h)`` are dropped, then
      the top ``B`` by ``h`` are kept (``selection``'s sinks and recent window are protected).
    - ``logit_bias = beta * log(0.5 + 0.5 * recency / max(recency))`` on every cached entry.

    Choices where the paper is silent (see the issue 4 report):

    - ``recency`` is clipped to [0, 1] so that it stays on the scale of ``c / max c`` in ``h``;
      without the clip the steady state ``alpha * s / (1 - gamma)`` exceeds 1.
    - ``relevance="relu"``: ``s = max(cos, 0)``; ``"affine"``: ``(1 + cos) / 2``; ``"max"``:
      ``max(cos, 0) / max_j max(cos_j, 0)``.
    - A turn is ``turn_length`` decode steps; the prompt counts as one turn whose mean query is
      the mean of its last ``turn_length`` queries (``observe_prefill``). For single-turn tasks
      this is the per-chunk schedule (a recency update every ``turn_length`` decode steps).
    - The turn's mean query is the mean of the decode queries seen in ``LayerView.queries``
      (mean over the query heads of a KV head).
    - Per-KV-head keep sets must have one size for all heads (physical gather), so with
      ``granularity="head"`` the threshold drops entries only down to the largest number of
      entries any head keeps above its threshold; with one head (the dialog world) or one
      keep set per layer it is exact.
    - No eviction at step 0 (the first decode step sees the whole prompt, as ``ScoredEviction``).
    - With no budget (``rho=0`` and no ``budget_tokens``) and ``beta=0`` the method does
      nothing; with ``beta>0`` and no budget it still tracks the channels and biases attention.

    Parameters:
        selection: budget, protected sinks/window, granularity (``head``: one state and keep
            set per layer and KV head; ``layer``; ``token``: one state shared by all).
        gamma: per-turn decay of ``recency`` (0.88).
        alpha0: base reinforcement rate (0.3).
        mu: sensitivity of the rate to the ownership loss (0.4).
        tau: relative threshold on ``h`` below which entries are dropped (0.02).
        beta: strength of the attention modulation; 0 disables the bias (0.25).
        w_c, w_recency: weights of the two channels in ``h`` (0.45, 0.55).
        turn_length: decode steps per turn (update period of both channels).
        c_every_step: accumulate ``c`` every decode step instead of once per turn.
        relevance: normalisation of the cosine, one of ``relu``, ``affine``, ``max``.
        name: label for records and tables.
    """

    selection: Selection = field(default_factory=lambda: Selection(granularity="head"))
    gamma: float = 0.88
    alpha0: float = 0.3
    mu: float = 0.4
    tau: float = 0.02
    beta: float = 0.25
    w_c: float = 0.45
    w_recency: float = 0.55
    turn_length: int = 32
    relevance: str = "relu"
    c_every_step: bool = False
    name: str = "fdkvc"

    def __post_init__(self) -> None:
        require_number("method.gamma", self.gamma, 0.88, minimum=0.0, maximum=1.0)
        for option, example in (("alpha0", 0.3), ("mu", 0.4), ("beta", 0.25), ("w_c", 0.45), ("w_recency", 0.55)):
            require_number(f"method.{option}", getattr(self, option), example, minimum=0.0)
        require_number("method.tau", self.tau, 0.02, minimum=0.0, maximum=1.0, open_max=True)
        if self.w_c + self.w_recency <= 0:
            raise ValueError(
                f"method.w_c={self.w_c!r} and method.w_recency={self.w_recency!r} are both 0, so no entry ranks "
                "above another "
                "— use e.g. method.w_c=0.45 method.w_recency=0.55"
            )
        require_int("method.turn_length", self.turn_length, minimum=1, example=32)
        if self.relevance not in RELEVANCE_NORMS:
            raise ValueError(
                f"method.relevance={self.relevance!r} is not a relevance normalisation "
                f"— use one of {', '.join(RELEVANCE_NORMS)}"
            )

    # ----------------------------------------------------------------- state layout
    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.selection.budget_for(info.prefill_len)
        self._active = self._budget is not None or self.beta > 0
        capacity = info.prefill_len + info.max_new_tokens + 1
        granularity = self.selection.granularity
        self._layers = 1 if granularity == "token" else info.num_layers
        self._rows = info.num_kv_heads if granularity == "head" else 1
        shape = (self._layers, self._rows, capacity)
        # Every slot starts at c = 1, recency = 1: a position is only ever touched once cached, so
        # an entry entering the cache finds its initial values already there.
        self.c = torch.ones(shape, device=info.device)
        self.recency = torch.ones(shape, device=info.device)
        # Per-turn accumulators, per model layer and KV head (queries live in per-layer spaces).
        self._query_sum: list[Tensor | None] = [None] * info.num_layers
        self._query_count = [0] * info.num_layers
        self._step = -1
        self._turn_start = 0
        # The relevance s of the turn, reduced to state rows, applied in keep() once every
        # layer has contributed.
        self._relevance = torch.zeros(shape, device=info.device)
        self._attention_sum = torch.zeros(shape, device=info.device)
        self._relevance_pending = False
        self.last_alpha: Tensor | None = None
        self.last_loss: Tensor | None = None

    def budget(self) -> int | None:
        return self._budget

    @property
    def wants_prefill_queries(self) -> int:
        return self.turn_length if getattr(self, "_active", False) else 0

    def observes(self, step: int) -> bool:
        return self._active

    def needs_attention(self, step: int) -> bool:
        return self._active

    def _state_layer(self, layer: int) -> int:
        return 0 if self._layers == 1 else layer

    def _row_positions(self, positions: Tensor) -> Tensor:
        return positions if self._rows > 1 else positions[:1]

    def _to_rows(self, per_head: Tensor) -> Tensor:
        """``(kv_heads, T)`` -> ``(rows, T)``: heads pooled unless the state is per head."""
        return per_head if self._rows > 1 else per_head.mean(dim=0, keepdim=True)

    def _turn_end(self, step: int) -> bool:
        return step > 0 and step % self.turn_length == 0

    # ----------------------------------------------------------------- channels
    def hybrid(self, c: Tensor, recency: Tensor) -> Tensor:
        """``h = w_c * c / max(c) + w_recency * recency`` per row, for ``(rows, T)`` channel values."""
        c_hat = c / c.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        return self.w_c * c_hat + self.w_recency * recency

    def rate(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(alpha_t, L_t)`` per row from the hybrid scores ``(rows, T)`` of the cached entries."""
        h_hat = h / h.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        loss = (h_hat * (1.0 - h_hat)).mean(dim=-1)
        return self.alpha0 / (1.0 + self.mu * loss), loss

    def _normalise(self, cosine: Tensor) -> Tensor:
        if self.relevance == "affine":
            return 0.5 * (1.0 + cosine)
        positive = cosine.clamp_min(0.0)
        if self.relevance == "max":
            return positive / positive.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        return positive

    def _add_relevance(self, layer: int, positions: Tensor, per_head: Tensor) -> None:
        rows = self._to_rows(per_head)
        if self._layers == 1 and self.info.num_layers > 1:
            # Token granularity: one shared state, each layer contributes its share.
            rows = rows / self.info.num_layers
        target = self._relevance[self._state_layer(layer)]
        target.scatter_add_(1, self._row_positions(positions), rows)
        self._relevance_pending = True

    def _turn_relevance(self, layer: int, keys: Tensor, positions: Tensor) -> None:
        """Relevance ``s`` of every cached entry of ``layer`` to the turn just ended."""
        mean_query = self._query_sum[layer] / self._query_count[layer]
        cosine = torch.nn.functional.cosine_similarity(keys.float(), mean_query[:, None, :], dim=-1)
        self._add_relevance(layer, positions, self._normalise(cosine))
        self._query_sum[layer] = None
        self._query_count[layer] = 0

    def _accumulate_query(self, layer: int, queries: Tensor) -> None:
        kv_heads = self.info.num_kv_heads
        heads, count, dim = queries.shape
        # Mean over the query heads of each KV head; sum over the query rows.
        grouped = queries.float().reshape(kv_heads, heads // kv_heads, count, dim).mean(dim=1).sum(dim=1)
        previous = self._query_sum[layer]
        self._query_sum[layer] = grouped if previous is None else previous + grouped
        self._query_count[layer] += count

    def observe_prefill(self, view: LayerView) -> None:
        if view.queries is None:
            return
        self._accumulate_query(view.layer, view.queries)
        self._turn_relevance(view.layer, view.keys, view.positions)

    def observe(self, view: LayerView) -> None:
        if view.weights is None or view.queries is None:
            raise ValueError("FD-KVC needs the attention weights and the query of the current step")
        attention = view.weights.float().mean(dim=1)
        rows = self._to_rows(attention)
        state_positions = self._row_positions(view.positions)
        if self.c_every_step:
            c = self.c[self._state_layer(view.layer)]
            c.scatter_(1, state_positions, c.gather(1, state_positions) + rows)
        else:
            self._attention_sum[self._state_layer(view.layer)].scatter_add_(1, state_positions, rows)
        self._accumulate_query(view.layer, view.queries)
        # observe() at step t always follows keep(t - 1).
        if self._turn_end(self._step + 1):
            self._turn_relevance(view.layer, view.keys, view.positions)

    def _update_channels(self, positions: list[Tensor], steps: int) -> None:
        """Turn end: add the turn's mean attention to ``c``, then decay and reinforce ``recency``."""
        alphas, losses = [], []
        for layer in range(self._layers):
            cached = self._row_positions(positions[layer])
            recency_rows = self.recency[layer]
            if not self.c_every_step and steps > 0:
                c_rows = self.c[layer]
                turn_mean = self._attention_sum[layer].gather(1, cached) / steps
                c_rows.scatter_(1, cached, c_rows.gather(1, cached) + turn_mean)
            c = self.c[layer].gather(1, cached)
            recency = recency_rows.gather(1, cached)
            alpha, loss = self.rate(self.hybrid(c, recency))
            relevance = self._relevance[layer].gather(1, cached)
            updated = (self.gamma * recency + alpha[:, None] * relevance).clamp(0.0, 1.0)
            recency_rows.scatter_(1, cached, updated)
            alphas.append(alpha)
            losses.append(loss)
        self.last_alpha = torch.stack(alphas)
        self.last_loss = torch.stack(losses)
        self._relevance.zero_()
        self._attention_sum.zero_()
        self._relevance_pending = False

    # ----------------------------------------------------------------- eviction and bias
    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        self._step = step
        if not self._active:
            return None
        if self._relevance_pending and (step == 0 or self._turn_end(step)):
            self._update_channels(positions, step - self._turn_start)
            self._turn_start = step
        if self._budget is None or step == 0:
            return None
        seen = self.info.prefill_len + step
        if self.selection.granularity == "token":
            chosen = self._choose(0, positions[0][:1], seen)
            return None if chosen is None else [chosen[0]] * len(positions)
        plan = []
        for layer, layer_positions in enumerate(positions):
            cached = self._row_positions(layer_positions)
            chosen = self._choose(layer, cached, seen)
            if chosen is None:
                chosen = torch.arange(cached.shape[-1], device=cached.device)[None].expand_as(cached)
            plan.append(chosen if self._rows > 1 else chosen[0])
        if all(index.shape[-1] == p.shape[-1] for index, p in zip(plan, positions, strict=True)):
            return None
        return plan

    def _choose(self, layer: int, cached: Tensor, seen: int) -> Tensor | None:
        """Sorted indices to keep for the rows ``cached`` ``(rows, T)`` of state layer ``layer``."""
        h = self.hybrid(self.c[layer].gather(1, cached), self.recency[layer].gather(1, cached))
        recent = self.selection.recent(self._budget)
        protected = (cached < self.selection.sinks) | (cached >= seen - recent)
        above = (h >= self.tau * h.amax(dim=-1, keepdim=True)) | protected
        # One keep size for every row (per-head sets are gathered into one tensor).
        size = min(self._budget, int(above.sum(dim=-1).max()))
        if size >= cached.shape[-1]:
            return None
        priority = h.masked_fill(~above, -torch.inf)
        return self.selection.select(priority, cached, seen, size)

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        if not self._active or self.beta == 0:
            return None
        recency = self.recency[self._state_layer(layer)].gather(1, self._row_positions(positions))
        recency_hat = recency / recency.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        bias = self.beta * torch.log(0.5 + 0.5 * recency_hat)
        return bias.expand(positions.shape[0], -1)
