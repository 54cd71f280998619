"""KVpop eviction policy: per KV head, s sinks + w recent + the top-k older tokens by decayed score.

KVpop ("Retrofitting LLMs with xLSTM-guided Token Eviction", openreview R54wzDIb0L): at query
position ``q`` an older token ``t`` ranks by ``r(q) = r_hat_t + floor((q - t) / n) * log gamma_h``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.kvpop.checkpoint import TRAIN, load_checkpoint
from methods.kvpop.scorers import SCORERS, MLSTMScorer, MLSTMState
from methods.options import require_int
from methods.selection import Selection, check_rho, exact_floor


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


@dataclass
class KVpop(EvictionMethod):
    """KVpop (openreview R54wzDIb0L): learned per-KV-head eviction with a per-head decay.

    Every KV head keeps ``s`` sinks, the ``w`` most recent tokens and the ``k`` older tokens with
    the highest ``r_hat + floor((q - t) / n) log gamma_h``, physically (``B = s + w + k`` entries
    per layer and head). ``r_hat`` comes from the checkpoint's scorer on the token's detached
    ``[k; v]``; the stateful mLSTM scorer reads a token out when it leaves the recent window.

    Parameters:
        checkpoint: path to a scorer trained by ``harness.training.kvpop`` (safetensors).
        model: name of the evaluated model; must match the checkpoint's (None: geometry check only).
        scorer_kind: the scorer kind the checkpoint must hold (``mlstm``/``mlp``), None to accept either.
        rho: compression ratio; with ``k`` None the budget is ``B = floor((1 - rho) L0)`` and
            ``k = B - s - w`` (standard rho sweeps). ``rho = 0`` and no ``k``: no eviction.
        k: fixed number of older tokens kept (overrides ``rho``).
        sinks, window, bucket: ``s``, ``w``, ``n``; None takes the values the checkpoint was trained for.
        name: label for records and tables.
    """

    checkpoint: str | None = None
    model: str | None = None
    scorer_kind: str | None = None
    rho: float = 0.0
    k: int | None = None
    sinks: int | None = None
    window: int | None = None
    bucket: int | None = None
    name: str = "kvpop"

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, str):
            raise ValueError(f"method.checkpoint={self.checkpoint!r} is not a checkpoint path — {TRAIN}")
        if self.scorer_kind is not None and self.scorer_kind not in SCORERS:
            raise ValueError(
                f"method.scorer_kind={self.scorer_kind!r} is not a KVpop scorer — use one of "
                f"{', '.join(sorted(SCORERS))}, "
                "or null to accept either"
            )
        check_rho(self.rho)
        k = self.k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            # The only budget check a fixed k needs: s + w + k then always holds the sinks and window.
            raise ValueError(
                f"method.k={k!r} is not a number >= 1 of older tokens kept beyond sinks+window — raise method.k, "
                "e.g. method.k=96, or set method.k=null to follow rho"
            )
        # None takes the checkpoint's training value, so only a given value is checked here.
        for option, minimum, example in (("sinks", 0, 4), ("window", 0, 32), ("bucket", 1, 1)):
            if getattr(self, option) is not None:
                require_int(f"method.{option}", getattr(self, option), minimum, example)
        self.net, self.trained = load_checkpoint(self.checkpoint)
        if self.scorer_kind is not None and self.net.kind != self.scorer_kind:
            raise ValueError(
                f"method.scorer_kind={self.scorer_kind!r} but method.checkpoint={self.checkpoint!r} holds a "
                f"{self.net.kind} scorer — pass a {self.scorer_kind} checkpoint (python -m harness.training.kvpop "
                f"kvpop.scorer={self.scorer_kind}), or use method.scorer_kind={self.net.kind}"
            )
        if self.model is not None:
            self.trained.check_model(self.model, self.checkpoint)
        # Options left at None take the values the scorer was trained for.
        for option in ("sinks", "window", "bucket"):
            if getattr(self, option) is None:
                setattr(self, option, self.trained.policy[option])
        self.selection = Selection(sinks=self.sinks, window=self.window, granularity="head")

    def budget_for(self, prefill_len: int) -> int | None:
        """``B = s + w + k`` with a fixed ``k``, else ``floor((1 - rho) L0)``; None when nothing is evicted."""
        if self.k is not None:
            return self.sinks + self.window + self.k
        if self.rho == 0.0:
            return None
        budget = exact_floor((1.0 - self.rho) * prefill_len)
        protected = self.sinks + self.window
        if budget < max(protected, 1):
            raise ValueError(
                f"KVpop budget B={budget} (rho={self.rho} of L0={prefill_len} prompt tokens) is smaller than "
                f"sinks+window={self.sinks}+{self.window}={protected} — lower rho or use longer prompts, or fix the "
                "budget with method.k"
            )
        return budget

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self.trained.check_geometry(self.checkpoint, info.num_layers, info.num_kv_heads)
        self._budget = self.budget_for(info.prefill_len)
        self.net.to(info.device)
        with torch.no_grad():
            self._log_gamma = self.net.log_gamma()
        capacity = info.prefill_len + info.max_new_tokens + 1
        # Static priorities over absolute positions; a token is ranked only after it left the
        # window, by which time it has been scored.
        self.base = torch.zeros(info.num_layers, info.num_kv_heads, capacity, device=info.device)
        self._scored = [0] * info.num_layers
        self._states: list[MLSTMState | None] = [None] * info.num_layers
        self._pending: list[Tensor | None] = [None] * info.num_layers

    def budget(self) -> int | None:
        return self._budget

    def observes(self, step: int) -> bool:
        return self._budget is not None

    def observe(self, view: LayerView) -> None:
        layer = view.layer
        self.trained.check_geometry(self.checkpoint, self.info.num_layers, self.info.num_kv_heads, view.keys.shape[-1])
        seen = int(view.positions[0, -1]) + 1
        count = seen - self._scored[layer]
        # New entries are appended at the end of the cache: the whole prompt at step 1, then one per step.
        keys, values = view.keys[:, -count:], view.values[:, -count:]
        with torch.no_grad():
            if isinstance(self.net, MLSTMScorer):
                scores, self._states[layer], self._pending[layer] = self.net.step(
                    keys, values, layer, self._states[layer], self._pending[layer]
                )
                first = self._scored[layer] - self.net.delay
            else:
                scores, first = self.net(keys, values, layer), self._scored[layer]
            positions = torch.arange(first, first + count, device=scores.device)
            valid = positions >= 0
            positions, scores = positions[valid], scores[:, valid]
            self.base[layer, :, positions] = static_base(
                scores.float(), positions, self._log_gamma[layer, :, None], self.bucket
            )
        self._scored[layer] = seen

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if self._budget is None or step == 0 or positions[0].shape[-1] <= self._budget:
            return None
        query = self.info.prefill_len + step - 1
        plan = []
        for layer, cached in enumerate(positions):
            priority = static_priority(
                self.base[layer].gather(1, cached), cached, query, self._log_gamma[layer, :, None], self.bucket
            )
            plan.append(self.selection.select(priority, cached, query + 1, self._budget))
        return plan
