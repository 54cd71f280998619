"""KVpop's eviction policy: per KV head, s sinks + w recent + the top-k older tokens by decayed score.

KVpop (arXiv 2607.05061), Eq. 1: every KV head keeps the first ``s`` tokens, the ``w`` most recent
and the ``k`` eligible tokens with the highest ``r_hat + floor((q - t) / n) * log gamma_h`` (Eq. 5),
``B = s + w + k`` entries. The stateful scorer's recurrent state costs memory too; as in the
paper's experiments, ``k`` shrinks so that cache plus state fit the budget of the stateless scorer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.finetuned import same_folder
from methods.kvpop.checkpoint import TRAIN, load_checkpoint
from methods.kvpop.ranking import static_base, static_priority
from methods.kvpop.recall import TeacherRecall
from methods.kvpop.scorers import SCORERS, KVpopScorer, MLSTMScorer, MLSTMState
from methods.options import is_int, require_int
from methods.selection import Selection, check_rho, exact_floor

#: Bytes per number of the mLSTM state, which is held in float32 whatever the cache dtype.
STATE_ITEMSIZE = 4


def state_entries(scorer: KVpopScorer, dtype: torch.dtype) -> int:
    """Cache entries (one KV head's key and value in ``dtype``) that the scorer's state costs per head."""
    entry = 2 * scorer.head_dim * torch.empty((), dtype=dtype).element_size()
    return math.ceil(scorer.state_numel() * STATE_ITEMSIZE / entry)


@dataclass
class KVpop(EvictionMethod):
    """KVpop (arXiv 2607.05061): learned per-KV-head eviction with a per-head decay.

    Every KV head keeps ``s`` sinks, the ``w`` most recent tokens and the ``k`` older tokens with
    the highest ``r_hat + floor((q - t) / n) log gamma_h``, physically. ``r_hat`` comes from the
    checkpoint's scorer on the token's detached ``[k; v]``; the stateful mLSTM scorer reads a token
    out when it leaves the recent window, with the token's ``[k; v]`` taken from the cache.

    Parameters:
        checkpoint: path to a policy trained by ``harness.training.kvpop`` (safetensors).
        model: name of the evaluated model; must match the checkpoint's (None: geometry check only).
        weights: the run's ``model.path``; a scorer trained jointly with a fine-tuned base model
            (``CheckpointInfo.base_model``) runs only on those weights.
        scorer_kind: the scorer kind the checkpoint must hold (``mlstm``/``mlp``), None to accept either.
        rho: compression ratio; without ``budget_tokens`` or ``k`` the memory budget per KV head is
            ``floor((1 - rho) L0)``. ``rho = 0`` and neither: no eviction.
        budget_tokens: fixed memory budget per KV head in cache entries (the paper's ``B``).
        k: fixed number of older tokens kept (overrides both, and counts no state).
        count_state: with a budget from ``rho`` or ``budget_tokens``, charge the scorer's recurrent
            state to it: ``k = B - s - w - ceil(state bytes / bytes of one entry)``.
        sinks, window, bucket: ``s``, ``w``, ``n``; None takes the values the checkpoint was trained for.
        recall_queries: measure the teacher recall (Fig. 7) at this many query positions and
            write it to the record (``recall``, ``recall_l<layer>_h<head>``); 0: not measured. It
            keeps a shadow of every key and computes dense attention at each step.
        pattern_tail: record, for the last ``pattern_tail`` evictable positions of the sequence, how
            many KV heads of each layer keep them at the end (Figs. 6 and 9); 0: not recorded.
        name: label for records and tables.
    """

    checkpoint: str | None = None
    model: str | None = None
    weights: str | None = None
    scorer_kind: str | None = None
    rho: float = 0.0
    budget_tokens: int | None = None
    k: int | None = None
    count_state: bool = False
    sinks: int | None = None
    window: int | None = None
    bucket: int | None = None
    recall_queries: int = 0
    pattern_tail: int = 0
    name: str = "kvpop"

    #: The training objective a checkpoint must come from (DMS's gates serve ``methods.dms``).
    objective = "kvpop"

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
        if k is not None and (not is_int(k) or k < 1):
            # The only budget check a fixed k needs: s + w + k then always holds the sinks and window.
            raise ValueError(
                f"method.k={k!r} is not a number >= 1 of older tokens kept beyond sinks+window — raise method.k, "
                "e.g. method.k=96, or set method.k=null to follow rho"
            )
        if self.budget_tokens is not None:
            require_int("method.budget_tokens", self.budget_tokens, 1, 2048)
        if not isinstance(self.count_state, bool):
            raise ValueError(f"method.count_state={self.count_state!r} is not true or false — use true or false")
        require_int("method.recall_queries", self.recall_queries, 0, 64)
        require_int("method.pattern_tail", self.pattern_tail, 0, 112)
        # None takes the checkpoint's training value, so only a given value is checked here.
        for option, minimum, example in (("sinks", 0, 4), ("window", 0, 32), ("bucket", 1, 1)):
            if getattr(self, option) is not None:
                require_int(f"method.{option}", getattr(self, option), minimum, example)
        self.net, self.trained = load_checkpoint(self.checkpoint)
        if self.trained.objective != self.objective:
            raise ValueError(
                f"method.checkpoint={self.checkpoint!r} holds a policy trained by the {self.trained.objective} "
                f"objective, not {self.objective}'s — use method={self.trained.objective}, or pass a checkpoint "
                f"trained for method={self.name}"
            )
        if self.scorer_kind is not None and self.net.kind != self.scorer_kind:
            raise ValueError(
                f"method.scorer_kind={self.scorer_kind!r} but method.checkpoint={self.checkpoint!r} holds a "
                f"{self.net.kind} scorer — pass a {self.scorer_kind} checkpoint (python -m harness.training.kvpop "
                f"kvpop.scorer={self.scorer_kind}), or use method.scorer_kind={self.net.kind}"
            )
        if self.model is not None:
            self.trained.check_model(self.model, self.checkpoint)
        base = self.trained.base_model
        if base is not None and not same_folder(base, self.weights):
            raise ValueError(
                f"method.checkpoint={self.checkpoint!r} was trained jointly with the base model fine-tuned in {base}, "
                f"but the run loads model.path={self.weights!r} — run with model.source=hub model.path={base}"
            )
        # Options left at None take the values the scorer was trained for.
        for option in ("sinks", "window", "bucket"):
            if getattr(self, option) is None:
                setattr(self, option, self.trained.policy[option])
        delay = getattr(self.net, "delay", 0)
        if delay > self.window:
            raise ValueError(
                f"method.window={self.window} is below the mLSTM's readout delay of {delay} tokens: the token it "
                f"scores would have left the cache — use method.window={delay} or more"
            )
        self.selection = Selection(sinks=self.sinks, window=self.window, granularity="head")

    def budget_for(self, prefill_len: int, dtype: torch.dtype = torch.float32) -> int | None:
        """Entries kept per KV head, ``s + w + k``; None when nothing is evicted.

        ``k`` is fixed by ``method.k``, or follows the memory budget (``budget_tokens``, else
        ``floor((1 - rho) L0)``) less the scorer's state when ``count_state`` is set.
        """
        if self.k is not None:
            return self.sinks + self.window + self.k
        if self.budget_tokens is not None:
            memory, origin = self.budget_tokens, f"method.budget_tokens={self.budget_tokens}"
            fix = "raise method.budget_tokens"
        elif self.rho == 0.0:
            return None
        else:
            memory = exact_floor((1.0 - self.rho) * prefill_len)
            origin, fix = f"rho={self.rho} of L0={prefill_len} prompt tokens", "lower rho or use longer prompts"
        state = state_entries(self.net, dtype) if self.count_state else 0
        protected = self.sinks + self.window
        if memory - state < max(protected, 1):
            charged = f" + the scorer state's {state} entries" if state else ""
            raise ValueError(
                f"KVpop budget B={memory} ({origin}) is smaller than sinks+window={self.sinks}+{self.window}="
                f"{protected}{charged} — {fix}, or fix the budget with method.k"
            )
        return memory - state

    def check(self, info: SequenceInfo) -> int | None:
        self.trained.check_geometry(self.checkpoint, info.num_layers, info.num_kv_heads)
        return self.budget_for(info.prefill_len, info.dtype)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self.net.to(info.device)
        with torch.no_grad():
            self._log_gamma = self.net.log_gamma()
        capacity = info.prefill_len + info.max_new_tokens + 1
        # Static priorities over absolute positions; a token is ranked only after it left the
        # window, by which time it has been scored.
        self.base = torch.zeros(info.num_layers, info.num_kv_heads, capacity, device=info.device)
        self._scored = [0] * info.num_layers
        self._states: list[MLSTMState | None] = [None] * info.num_layers
        self._teacher = TeacherRecall(self.window) if self.recall_queries and self._budget is not None else None
        self._last: list[Tensor] | None = None

    def budget(self) -> int | None:
        return self._budget

    @property
    def wants_prefill_queries(self) -> int:
        # The teacher counts the attention of the prompt's own queries too.
        return self.info.prefill_len if self._teacher is not None else 0

    def observes(self, step: int) -> bool:
        return self._budget is not None

    def observe_prefill(self, view: LayerView) -> None:
        view = view.to(self.info.device)
        self._teacher.observe(view.layer, view.queries, view.keys, view.scaling)

    def observe(self, view: LayerView) -> None:
        view = view.to(self.info.device)
        layer = view.layer
        self.trained.check_geometry(self.checkpoint, self.info.num_layers, self.info.num_kv_heads, view.keys.shape[-1])
        seen = view.seen if view.seen is not None else int(view.positions[0, -1]) + 1
        count = seen - self._scored[layer]
        if self._teacher is not None:
            fresh = seen - self._teacher.seen(layer)
            self._teacher.observe(layer, view.queries, view.keys[:, -fresh:], view.scaling)
        # New entries are appended at the end of the cache: the whole prompt at step 1, then one per step.
        keys, values = view.keys[:, -count:], view.values[:, -count:]
        with torch.no_grad():
            if isinstance(self.net, MLSTMScorer):
                read_keys, read_values = self._read_tokens(view, count)
                scores, self._states[layer] = self.net.step(
                    keys, values, layer, self._states[layer], read_keys, read_values
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

    def _read_tokens(self, view: LayerView, count: int) -> tuple[Tensor, Tensor]:
        """Keys and values of the tokens the new readouts score: ``delay`` positions behind each new one.

        They sit in the cache's tail, which the window keeps contiguous; readouts before the first
        token read zeros (and are dropped).
        """
        delay, length = self.net.delay, view.keys.shape[1]
        start = length - count - delay
        pad = max(-start, 0)
        keys, values = view.keys[:, max(start, 0) : length - delay], view.values[:, max(start, 0) : length - delay]
        if pad:
            zeros = keys.new_zeros(keys.shape[0], pad, keys.shape[-1])
            keys, values = torch.cat([zeros, keys], 1), torch.cat([zeros, values], 1)
        return keys, values

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if self._budget is None or step == 0:
            return None
        self._last = positions
        if positions[0].shape[-1] <= self._budget:
            return None
        query = self.info.prefill_len + step - 1
        plan = []
        for layer, cached in enumerate(positions):
            priority = static_priority(
                self.base[layer].gather(1, cached), cached, query, self._log_gamma[layer, :, None], self.bucket
            )
            plan.append(self.selection.select(priority, cached, query + 1, self._budget))
        self._last = [cached.gather(1, index) for cached, index in zip(positions, plan, strict=True)]
        return plan

    def state_bytes(self) -> int:
        """Bytes of the mLSTM state held now (all layers and heads); 0 for the stateless scorer."""
        return sum(
            tensor.numel() * tensor.element_size()
            for state in self._states
            if state is not None
            for tensor in (state.matrix, state.normaliser, state.stabiliser)
        )

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._last is None:
            return out
        seen = int(self._last[0][0, -1]) + 1
        k = self._budget - self.sinks - self.window
        if self._teacher is not None and seen > max(self.info.prefill_len, self.sinks + self.window + k):
            first = max(self.info.prefill_len, self.sinks + self.window + k)
            recall = self._teacher.recall(
                [self.base[layer, :, :seen].cpu() for layer in range(self.info.num_layers)],
                self._log_gamma.cpu(),
                self.sinks,
                k,
                self.bucket,
                first,
                self.recall_queries,
            )
            out["recall"] = round(float(recall.mean()), 4)
            for layer, row in enumerate(recall.tolist()):
                out |= {f"recall_l{layer}_h{head}": round(value, 4) for head, value in enumerate(row)}
        if self.pattern_tail:
            # The last evictable positions: older than the window, newer than the sinks.
            end = seen - self.window
            tail = list(range(max(self.sinks, end - self.pattern_tail), end))
            heads = [[int((cached == position).any(-1).sum()) for position in tail] for cached in self._last]
            out["pattern_positions"] = tail
            out["pattern_heads"] = heads
        return out
