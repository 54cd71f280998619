"""FD-KVC (Fractional Decay KV-Cache, arXiv 2608.18098): ownership-aware eviction for dialogs.

Every cached entry carries a cumulative-attention channel ``c`` (H2O-like) and a
recency-relevance channel ``recency`` (the paper's ρ) that forgets by ``gamma`` per turn and is
reinforced by the entry's relevance to the turn, at a rate that slows down when the cache's
ownership is uncertain. Eviction ranks by the hybrid ``h``; the kept entries' attention is
modulated by ``(0.5 + 0.5 * recency_hat) ** beta``, applied as an additive logit bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.options import require_int, require_number
from methods.selection import Selection

RELEVANCE_NORMS = ("minmax", "relu", "affine", "max")
RELEVANCE_SPACES = ("embeddings", "keys")
RECENCY_INITS = ("cosine", "one")
C_UPDATES = ("mean_query", "attention", "step")
RATES = ("previous", "current")
NORMALISE_OVER = ("cached", "with_turn")
_EPS = 1e-8


@dataclass
class FDKVC(EvictionMethod):
    """FD-KVC (arXiv 2608.18098): hybrid cumulative-attention / recency-relevance eviction.

    At every turn end (Algorithm 1), per layer and KV head, for the entries cached before the turn:

    1. ``c += softmax(q_mean . k / sqrt(d))`` over them, ``q_mean`` the turn's mean query (Eq. 1);
    2. ``recency *= gamma`` (Eq. 2);
    3. ``recency += alpha_t * r`` with ``r`` the min-max-normalised cosine between an entry and
       the turn's mean query embedding (Eqs. 3-4);
    4. ``h = w_c * c / max c + w_recency * recency`` (Eq. 5), the ownership loss
       ``L = mean h_hat (1 - h_hat)`` and the rate ``alpha = alpha0 / (1 + mu * L)`` (Eqs. 6-7);
    5. entries with ``h < tau * max h`` are dropped (Eq. 8);

    then the turn's own entries are inserted with ``c = 1`` and ``recency = max(cos, 0)`` (line
    17: ρ proportional to the cosine), and the top ``B`` by ``h`` are kept (``selection``'s sinks
    and recent window protected; equal ``h``: the newer entry wins). Every cached entry's logit
    gets ``beta * log(0.5 + 0.5 * recency / max recency)`` (Eq. 9).

    A turn is ``turn_length`` decode steps, or a world step that brings a whole turn at once
    (the dialog world). Between turn ends (decoding on a model) the budget is still held at
    every step: an entry that has just joined ranks with ``c = 1`` and the cosine to the turn's
    mean so far. The prompt is the first turn; its mean query is that of its last
    ``turn_length`` queries. A sequence's last decode step closes its turn, however short.

    Readings where the paper is ambiguous, each one option away from the earlier one:

    - ``relevance_space``: the cosine of Eq. 4 between the entries' token embeddings and the
      turn's mean token embedding (``embeddings``: Appendix B keeps the embeddings beside the
      keys for this; used where the caller has them, the dialog world, else keys), or between
      keys and the turn's mean query (``keys``).
    - ``relevance``: ``minmax`` (Eq. 4), ``relu`` (``max(cos, 0)``), ``affine``
      (``(1 + cos) / 2``), ``max`` (``max(cos, 0) / max``).
    - ``normalise_over``: the entries whose cosines set Eq. 4's min and max: those cached before
      the turn (``cached``: Algorithm 1 reinforces before it inserts the turn's entries), or
      those and the turn's own (``with_turn``). After a topic shift the cached entries are all
      of the old topic, so ``cached`` still spreads them over [0, 1].
    - ``recency_init``: ``cosine`` (Algorithm 1 as above) or ``one``: every entry enters at
      ``c = 1, recency = 1`` when it joins and the turn end updates every cached entry, the
      turn's own too.
    - ``c_update``: ``mean_query`` (Eq. 1), ``attention`` (the turn's mean per-step attention
      weights), ``step`` (every step's weights added, as H2O: old entries outgrow new ones by
      ``turn_length`` times more per turn).
    - ``rate``: ``previous`` (Algorithm 1's order: line 10 reinforces with the rate line 14
      computed at the previous turn end, ``alpha0`` at first) or ``current`` (from ``h`` after
      the ``c`` update and before the decay).
    - ``recency_clip``: clip ``recency`` to [0, 1]; the paper does not (its steady state
      ``alpha * r / (1 - gamma)`` reaches 2.5).
    - ``prompt_attention``: the prompt's mean query's softmax is added to its entries' ``c``
      (Algorithm 1 leaves a turn's own entries at ``c = 1``), so the first eviction after a long
      prompt, which removes most of it, ranks with both channels.
    - Per-KV-head keep sets have one size for all heads (physical gather): with
      ``granularity="head"`` the threshold drops entries only down to the largest number any
      head keeps above its own; with one head, or one keep set per layer, it is exact.
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
        turn_length: decode steps per turn.
        relevance, normalise_over, relevance_space, recency_init, c_update, rate, recency_clip,
            prompt_attention: the readings above (defaults: the earlier ones;
            ``conf/method/fdkvc.yaml`` names the paper's).
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
    normalise_over: str = "cached"
    relevance_space: str = "keys"
    recency_init: str = "one"
    c_update: str = "attention"
    rate: str = "current"
    recency_clip: bool = True
    prompt_attention: bool = False
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
        for option, choices, kind in (
            ("relevance", RELEVANCE_NORMS, "relevance normalisation"),
            ("normalise_over", NORMALISE_OVER, "set of entries to normalise over"),
            ("relevance_space", RELEVANCE_SPACES, "relevance space"),
            ("recency_init", RECENCY_INITS, "recency initialisation"),
            ("c_update", C_UPDATES, "cumulative-channel update"),
            ("rate", RATES, "rate timing"),
        ):
            if getattr(self, option) not in choices:
                raise ValueError(
                    f"method.{option}={getattr(self, option)!r} is not a {kind} — use one of {', '.join(choices)}"
                )
        for option in ("recency_clip", "prompt_attention"):
            if not isinstance(getattr(self, option), bool):
                raise ValueError(
                    f"method.{option}={getattr(self, option)!r} is not true or false — use method.{option}=true"
                )

    # ----------------------------------------------------------------- state layout
    def check(self, info: SequenceInfo) -> int | None:
        return self.selection.budget_for(info.prefill_len)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self._active = self._budget is not None or self.beta > 0
        capacity = info.prefill_len + info.max_new_tokens + 1
        granularity = self.selection.granularity
        self._layers = 1 if granularity == "token" else info.num_layers
        self._rows = info.num_kv_heads if granularity == "head" else 1
        shape = (self._layers, self._rows, capacity)
        # Every slot starts at c = 1, recency = 1: a position is only ever touched once cached, so
        # an entry entering the cache finds the earlier reading's initial values already there.
        self.c = torch.ones(shape, device=info.device)
        self.recency = torch.ones(shape, device=info.device)
        # What the turn's observations leave for its end, per state layer and position: the
        # increment of c and the cosine of Eq. 4 (layers of a shared state add their shares).
        self._gain = torch.zeros(shape, device=info.device)
        self._cosine = torch.zeros(shape, device=info.device)
        self._alpha = torch.full((self._layers, self._rows), self.alpha0, device=info.device)
        # Per model layer: the turn's query sum (per KV head) and count, and its embedding sum.
        self._query_sum: list[Tensor | None] = [None] * info.num_layers
        self._query_count = [0] * info.num_layers
        self._embedding_sum: list[Tensor | None] = [None] * info.num_layers
        self._observations = 0
        self._step = 0
        self._upcoming = 0
        # First position of the turn under way: the prompt is the first turn.
        self._turn_start = 0
        self._turn_pending = False
        self.last_alpha: Tensor | None = None
        self.last_loss: Tensor | None = None

    def budget(self) -> int | None:
        return self._budget

    @property
    def wants_prefill_queries(self) -> int:
        return self.turn_length if getattr(self, "_active", False) else 0

    def observes(self, step: int) -> bool:
        # The driver asks this as step ``step`` starts: the step observe() will see.
        self._upcoming = step
        return self._active

    def needs_attention(self, step: int) -> bool:
        return self._active and self.c_update != "mean_query"

    def probes(self) -> dict[str, Tensor]:
        """The last turn end's ownership loss and rate, ``(layers, rows)`` (NaN before any)."""
        if self.last_loss is None:
            nan = torch.full((self._layers, self._rows), float("nan"))
            return {"ownership_loss": nan, "rate": nan}
        return {"ownership_loss": self.last_loss, "rate": self.last_alpha}

    def _state_layer(self, layer: int) -> int:
        return 0 if self._layers == 1 else layer

    def _row_positions(self, positions: Tensor) -> Tensor:
        return positions if self._rows > 1 else positions[:1]

    def _to_rows(self, per_head: Tensor) -> Tensor:
        """``(kv_heads, T)`` -> ``(rows, T)``: heads pooled unless the state is per head."""
        rows = per_head if self._rows > 1 else per_head.mean(dim=0, keepdim=True)
        # Token granularity: one shared state, each layer contributes its share.
        return rows / self.info.num_layers if self._layers == 1 and self.info.num_layers > 1 else rows

    def _turn_end(self, step: int) -> bool:
        # A step that brings several tokens at once is a whole turn (the dialog world's).
        whole_turn = step - self._step > 1
        return step > 0 and (whole_turn or step % self.turn_length == 0 or step >= self.info.max_new_tokens)

    # ----------------------------------------------------------------- channels
    def hybrid(self, c: Tensor, recency: Tensor) -> Tensor:
        """``h = w_c * c / max(c) + w_recency * recency`` per row, for ``(rows, T)`` channel values."""
        c_hat = c / c.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        return self.w_c * c_hat + self.w_recency * recency

    def normalise(self, cosine: Tensor, among: Tensor) -> Tensor:
        """Relevance ``r`` of ``(rows, T)`` cosines, normalised over the entries ``among`` (a mask)."""
        if self.relevance == "affine":
            return 0.5 * (1.0 + cosine)
        if self.relevance == "minmax":
            low = cosine.masked_fill(~among, torch.inf).amin(dim=-1, keepdim=True)
            high = cosine.masked_fill(~among, -torch.inf).amax(dim=-1, keepdim=True)
            return ((cosine - low) / (high - low + _EPS)).clamp(0.0, 1.0)
        positive = cosine.clamp_min(0.0)
        if self.relevance == "max":
            return positive / positive.masked_fill(~among, 0.0).amax(dim=-1, keepdim=True).clamp_min(1e-12)
        return positive

    def _accumulate(self, view: LayerView, new: Tensor | None) -> None:
        """Add the step's queries (mean over each KV head's group) and its new entries' embeddings to the turn's."""
        kv_heads = self.info.num_kv_heads
        heads, count, dim = view.queries.shape
        grouped = view.queries.float().reshape(kv_heads, heads // kv_heads, count, dim).mean(dim=1).sum(dim=1)
        layer = view.layer
        previous = self._query_sum[layer]
        self._query_sum[layer] = grouped if previous is None else previous + grouped
        self._query_count[layer] += count
        if view.embeddings is not None and self.relevance_space == "embeddings":
            embeddings = view.embeddings.float()
            added = embeddings.sum(dim=1) if new is None else torch.bmm(new.float()[:, None, :], embeddings)[:, 0]
            previous = self._embedding_sum[layer]
            self._embedding_sum[layer] = added if previous is None else previous + added

    def _turn_cosine(self, view: LayerView) -> Tensor:
        """``(kv_heads, T)`` cosine of every entry to the turn so far (embeddings, or keys vs queries)."""
        layer = view.layer
        if self._embedding_sum[layer] is not None:
            entries, mean = view.embeddings, self._embedding_sum[layer]
        else:
            entries, mean = view.keys, self._query_sum[layer]
        # The sums point where the means do: only their directions matter.
        unit = torch.nn.functional.normalize(mean, dim=-1, eps=_EPS)
        dots = torch.bmm(entries.float(), unit[:, :, None])[..., 0]
        return dots / entries.float().norm(dim=-1).clamp_min(_EPS)

    def _mean_query_softmax(self, view: LayerView, among: Tensor) -> Tensor:
        """``(kv_heads, T)``: the turn's mean query's softmax over the entries ``among`` (Eq. 1), 0 elsewhere."""
        mean = self._query_sum[view.layer] / self._query_count[view.layer]
        logits = torch.einsum("hd,htd->ht", mean, view.keys.float()) * view.scaling
        return torch.softmax(logits.masked_fill(~among, -torch.inf), dim=-1).nan_to_num(0.0)

    def _record_turn(self, view: LayerView, closing: bool, prompt: bool) -> None:
        """What this observation leaves for the turn end, or for the newest entries' provisional values."""
        if not closing and self.recency_init == "one":
            return
        state = self._state_layer(view.layer)
        positions = self._row_positions(view.positions)
        self._cosine[state].scatter_(1, positions, self._to_rows(self._turn_cosine(view)))
        if not closing:
            return
        everyone = torch.ones_like(view.positions, dtype=torch.bool)
        before = everyone if self.recency_init == "one" else view.positions < self._turn_start
        if self.c_update == "mean_query" or (prompt and self.prompt_attention):
            among = everyone if (prompt and self.prompt_attention) else before
            self._gain[state].scatter_add_(1, positions, self._to_rows(self._mean_query_softmax(view, among)))
        self._query_sum[view.layer] = None
        self._query_count[view.layer] = 0
        self._embedding_sum[view.layer] = None

    def observe_prefill(self, view: LayerView) -> None:
        if view.queries is None:
            return
        view = view.to(self.info.device)
        self._accumulate(view, None)
        self._record_turn(view, closing=True, prompt=True)
        self._turn_pending = True

    def observe(self, view: LayerView) -> None:
        view = view.to(self.info.device)
        if view.queries is None or (view.weights is None and self.c_update != "mean_query"):
            raise ValueError("FD-KVC needs the attention weights and the query of the current step")
        state = self._state_layer(view.layer)
        positions = self._row_positions(view.positions)
        if self.c_update != "mean_query":
            attention = self._to_rows(view.weights.float().mean(dim=1))
            if self.c_update == "step":
                c = self.c[state]
                c.scatter_(1, positions, c.gather(1, positions) + attention)
            else:
                self._gain[state].scatter_add_(1, positions, attention)
        self._accumulate(view, view.positions >= self.info.prefill_len + self._step)
        self._record_turn(view, closing=self._turn_end(self._upcoming), prompt=False)
        self._turn_pending = True

    def _close_turn(self, positions: list[Tensor]) -> None:
        """Algorithm 1 at a turn end, for every state layer."""
        alphas, losses = [], []
        prompt = self._turn_start == 0
        for layer in range(self._layers):
            cached = self._row_positions(positions[layer])
            c_rows, recency_rows = self.c[layer], self.recency[layer]
            if self.recency_init == "one":
                before = torch.ones_like(cached, dtype=torch.bool)
            else:
                before = cached < self._turn_start
            gain = self._gain[layer].gather(1, cached)
            if self.c_update == "attention" and self._observations:
                gain = gain / self._observations
            c = torch.where(before, c_rows.gather(1, cached) + gain, c_rows.gather(1, cached))
            recency = recency_rows.gather(1, cached)
            cosine = self._cosine[layer].gather(1, cached)
            relevance = self.normalise(cosine, before if self.normalise_over == "cached" else torch.ones_like(before))
            if self.rate == "current":
                alpha, loss = self.adaptive_rate(c, recency, before)
                used = alpha
            else:
                used = self._alpha[layer]
            updated = self.gamma * recency + used[:, None] * relevance
            if self.recency_clip:
                updated = updated.clamp(0.0, 1.0)
            recency = torch.where(before, updated, recency)
            if self.rate == "previous":
                alpha, loss = self.adaptive_rate(c, recency, before)
                self._alpha[layer] = alpha
            if self.recency_init == "cosine":
                c = torch.where(before, c, 1.0 + gain if (prompt and self.prompt_attention) else torch.ones_like(c))
                recency = torch.where(before, recency, cosine.clamp_min(0.0))
            c_rows.scatter_(1, cached, c)
            recency_rows.scatter_(1, cached, recency)
            alphas.append(alpha)
            losses.append(loss)
        self.last_alpha = torch.stack(alphas)
        self.last_loss = torch.stack(losses)
        self._gain.zero_()
        self._observations = 0
        self._turn_pending = False

    def adaptive_rate(self, c: Tensor, recency: Tensor, among: Tensor) -> tuple[Tensor, Tensor]:
        """``(alpha_t, L_t)`` per row (Eqs. 6-7) from the channels ``(rows, T)`` of the entries ``among`` (a mask;
        a row with none: ``alpha0`` and a NaN loss)."""
        c_hat = c / c.masked_fill(~among, 0.0).amax(dim=-1, keepdim=True).clamp_min(1e-12)
        h = (self.w_c * c_hat + self.w_recency * recency).masked_fill(~among, 0.0)
        h_hat = h / h.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        count = among.sum(dim=-1)
        loss = (h_hat * (1.0 - h_hat)).sum(dim=-1) / count.clamp_min(1)
        return self.alpha0 / (1.0 + self.mu * loss), loss.masked_fill(count == 0, float("nan"))

    def _provisional(self, positions: list[Tensor]) -> None:
        """Mid-turn: the entries that joined this step rank with ``c = 1`` and the cosine to the turn so far."""
        first = self.info.prefill_len + self._step
        for layer in range(self._layers):
            cached = self._row_positions(positions[layer])
            cosine = self._cosine[layer].gather(1, cached).clamp_min(0.0)
            recency = self.recency[layer].gather(1, cached)
            self.recency[layer].scatter_(1, cached, torch.where(cached >= first, cosine, recency))

    # ----------------------------------------------------------------- eviction and bias
    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if not self._active:
            self._step = step
            return None
        self._observations += step > 0
        closing = self._turn_pending and (step == 0 or self._turn_end(step))
        # The entries the threshold tests: those cached before the turn that ends here (Eq. 8
        # runs before the turn's own are inserted); every entry, every step, in the earlier reading.
        tested_before = self._turn_start if closing else None
        if closing:
            self._close_turn(positions)
            self._turn_start = self.info.prefill_len + step
        elif step > 0 and self.recency_init == "cosine":
            self._provisional(positions)
        self._step = step
        if self._budget is None or step == 0:
            return None
        seen = self.info.prefill_len + step
        layers = [positions[0][:1]] if self.selection.granularity == "token" else positions
        rows = [self._row_positions(cached) for cached in layers]
        candidates = [self._candidates(layer, cached, seen, tested_before) for layer, cached in enumerate(rows)]
        # Each layer keeps one size for all its rows (per-head sets are gathered into one tensor);
        # the sizes of every layer are read from the device at once.
        sizes = torch.stack([above.sum(dim=-1).max() for _, above in candidates]).tolist()
        plan = []
        for cached, (h, above), size in zip(rows, candidates, sizes, strict=True):
            size = min(self._budget, size)
            if size >= cached.shape[-1]:
                chosen = torch.arange(cached.shape[-1], device=cached.device)[None].expand_as(cached)
            else:
                priority = _ranks_newest_first(h, cached).masked_fill(~above, -torch.inf)
                chosen = self.selection.select(priority, cached, seen, size)
            plan.append(chosen if self._rows > 1 else chosen[0])
        if self.selection.granularity == "token":
            plan = plan * len(positions)
        if all(index.shape[-1] == p.shape[-1] for index, p in zip(plan, positions, strict=True)):
            return None
        return plan

    def _candidates(self, layer: int, cached: Tensor, seen: int, tested_before: int | None) -> tuple[Tensor, Tensor]:
        """The hybrid scores ``h`` of the rows ``cached`` ``(rows, T)`` of state layer ``layer``, and
        which entries may stay: those above ``tau * max h`` and the protected ones."""
        h = self.hybrid(self.c[layer].gather(1, cached), self.recency[layer].gather(1, cached))
        recent = self.selection.recent(self._budget)
        if self.recency_init == "one":
            tested = torch.ones_like(cached, dtype=torch.bool)
        elif tested_before is not None:
            tested = cached < tested_before
        else:
            tested = torch.zeros_like(cached, dtype=torch.bool)
        protected = (cached < self.selection.sinks) | (cached >= seen - recent) | ~tested
        top = h.masked_fill(~tested, -torch.inf).amax(dim=-1, keepdim=True)
        return h, (h >= self.tau * top) | protected

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        if not self._active or self.beta == 0:
            return None
        recency = self.recency[self._state_layer(layer)].gather(1, self._row_positions(positions))
        recency_hat = recency / recency.amax(dim=-1, keepdim=True).clamp_min(1e-12)
        bias = self.beta * torch.log(0.5 + 0.5 * recency_hat)
        return bias.expand(positions.shape[0], -1)


def _ranks_newest_first(h: Tensor, positions: Tensor) -> Tensor:
    """``(rows, T)`` priorities ordering entries by ``h``, ties broken for the newer position (no two equal)."""
    newest_first = positions.argsort(dim=-1, descending=True)
    order = newest_first.gather(-1, h.gather(-1, newest_first).sort(dim=-1, descending=True, stable=True).indices)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=h.device).expand_as(order))
    return -ranks.float()
