"""Prefill, then a decode loop in which the method observes and physically evicts.

Every sequence gets its own keep sets, budget, positions and cache. ``generate`` decodes one
sequence; ``generate_batch`` decodes several together (each prefilled alone, then one forward per
step for all of them: the weights are read once per step, the attention runs per sequence over
its own cache). The cache is preallocated (``kv_cache.SlotLayer``):
a new token is written into a free slot, and an order-free method's one eviction per step
refills the evicted slot with the last entry, so a steady-state step copies no layer.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel

from harness.decode import kv_cache
from harness.decode.attention import select
from harness.decode.evicting_attention import EVICTING, BatchState, StepState
from harness.decode.reconstruction import reconstruction_passes
from harness.decode.sampling import Sampling
from harness.decode.steady import SteadyLoop, SteadyRows, TokenReader, host_token
from harness.models import check_length
from harness.record.schema import Figures
from methods.base import EvictionMethod, SequenceInfo
from methods.driver import Driver
from methods.stopwatch import Stopwatch, Unclocked, synchronize


@dataclass
class Generation(Figures):
    """The outcome of one sequence: the record's ``Figures`` (``harness.record.schema``), the tokens and
    what only the engine's callers read.

    Parameters:
        tokens: generated token ids (a final end-of-turn token included; ``new_tokens`` counts them).
        max_cache_len: the largest cache length seen after any decode step's eviction.
        target_logprobs: with ``forced`` tokens, the log-probability the model gave each one
            (teacher forcing under eviction, for perplexity).
        target_greedy: with ``forced`` tokens, whether each one was the model's most likely
            token (lm-eval's ``is_greedy``).
        method_report: what the method measured about the sequence (``EvictionMethod.report``).
    """

    tokens: list[int] = field(default_factory=list)
    max_cache_len: int = 0
    target_logprobs: list[float] = field(default_factory=list)
    target_greedy: list[bool] = field(default_factory=list)
    method_report: dict[str, Any] = field(default_factory=dict)


StepHook = Callable[[int, StepState, object], None]


def rotary_embedding(model: PreTrainedModel) -> torch.nn.Module | None:
    """The model's rotary embedding (the module holding ``inv_freq``), or None without RoPE."""
    return next((m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), Tensor)), None)


def sequence_info(
    config: PretrainedConfig,
    prefill_len: int,
    max_new_tokens: int,
    seed: int = 0,
    device: torch.device | None = None,
    model: PreTrainedModel | None = None,
    numerics: int = 1,
) -> SequenceInfo:
    """What a method may know about a sequence on the model of ``config`` (its RoPE with ``model``), computed
    under ``numerics``."""
    text = config.get_text_config()
    rotary = None if model is None else rotary_embedding(model)
    return SequenceInfo(
        prefill_len=prefill_len,
        num_layers=text.num_hidden_layers,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        num_query_heads=text.num_attention_heads,
        max_new_tokens=max_new_tokens,
        seed=seed,
        device=device if device is not None else torch.device("cpu"),
        rope_inv_freq=None if rotary is None else rotary.inv_freq.float(),
        rope_scale=1.0 if rotary is None else float(getattr(rotary, "attention_scaling", 1.0)),
        dtype=torch.float32 if model is None else model.dtype,
        numerics=numerics,
    )


def _cuda_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose allocator peaks count (every visible one: a sharded model spans several)."""
    return list(range(torch.cuda.device_count())) if device.type == "cuda" else []


def _reset_peak(device: torch.device) -> None:
    for index in _cuda_devices(device):
        torch.cuda.reset_peak_memory_stats(index)


def _peak(device: torch.device, cache_peak: int) -> int:
    """The allocator's peak since ``_reset_peak`` on CUDA; elsewhere the cache's peak ``cache_peak``."""
    devices = _cuda_devices(device)
    return sum(torch.cuda.max_memory_allocated(index) for index in devices) if devices else cache_peak


def visible_entries(driver: Driver, cache: object) -> float:
    """Entries attention can see now, mean over layers and KV heads (a -inf logit bias hides an entry)."""
    seen = heads = 0
    for layer, lengths in enumerate(kv_cache.head_lengths(cache)):
        bias = driver.bias(layer)
        heads += len(lengths)
        if bias is None:
            seen += sum(lengths)
        else:
            rows = bias if isinstance(bias, tuple) else [bias]
            seen += sum(int(torch.isfinite(row).sum()) for row in rows)
    return seen / heads


def held_entries(cache: object) -> float:
    """Entries held in memory now, mean over layers and KV heads (masked entries included)."""
    lengths = [n for layer in kv_cache.head_lengths(cache) for n in layer]
    return sum(lengths) / len(lengths)


def check_servable(
    config: PretrainedConfig, method: EvictionMethod, prefill_len: int, max_new_tokens: int, what: str
) -> int | None:
    """Refuse, before any weights load, a sequence the model or the method cannot serve; else the method's budget.

    Refused: a sequence longer than the model's positions, and what the method refuses (a
    budget below sinks+window, a checkpoint for another geometry). ``what`` names the sequence.
    """
    check_length(config, prefill_len, max_new_tokens, what)
    return method.check(sequence_info(config, prefill_len, max_new_tokens))


#: ``numerics``: how a decode step computes, each a fixed rounding (a run id names any but the first).
#: 1: the reference; a ragged layer's heads packed one after another and attended one by one, and a
#: batch step's rows attended one by one.
#: 2: fewer kernels a step; a per-head cut's heads padded to one length (``kv_cache.PaddedHeadsLayer``)
#: and attended in one masked pass; the rows of a batch step that only appends in one buffer per
#: layer (``kv_cache.SharedSlots``), attended at once; and a batch whose rows are all in their method's
#: steady loop served as one steady step (``harness.decode.steady.SteadyRows``).
#: 3: 2, and the scored methods' arithmetic regrouped (``SequenceInfo.numerics``): a pooled score's one
#: mean over the query heads (``Scorer.pooled``), a layer-shared state's one decay a step
#: (``Aggregator.fold_layers``).
#: 4: 3, and a step's arithmetic folded further: the explicit attention's scale and bias in the logits'
#: product (``evicting_attention.query_attention``), and a layer-shared state under a linear rule takes the
#: step's layers in one pass and one fold (``Aggregator.layer_coefficients``, ``Scorer.layer_mean``).
#: Each sums in another order than the one before, so a near-tie in a keep set can flip.
NUMERICS = (1, 2, 3, 4)


@dataclass
class Engine:
    """Runs a model under an eviction method.

    Parameters:
        model: any decoder-only transformers causal LM with standard attention modules.
        method: the eviction method (fresh state per sequence through ``begin``; ``generate_batch``
            serves each sequence of a batch with a copy of it).
        sampling: greedy by default.
        on_step: optional callback ``(step, context, cache)`` after each step's eviction
            (tests and diagnostics; every step is then eager and profiled).
        tokenizer: the model's tokenizer, for methods that reconstruct the context (KVzip).
        profile: time the method and the gathers at every decode step (``score_s``, ``evict_s``);
            steps are then eager. Off: one interval per step (``decode_s``), and a method with a
            static steady state decodes it in ``harness.decode.steady``'s step.
        steady: how steady steps run (``harness.decode.steady.MODES``); None: ``graph`` on CUDA,
            ``eager`` elsewhere.
        around_step: optional ``step -> context manager`` entered around each decode step of ``generate``
            (the bench counts a step's kernels and host syncs inside it).
        token_lag: how many steady steps behind the device the host reads the tokens
            (``harness.decode.steady.TokenReader``); None: 4 on CUDA, 0 elsewhere.
        numerics: how a decode step computes (``NUMERICS``; a run's ``numerics=auto`` is
            ``harness.config.resolve_numerics``).
    """

    model: PreTrainedModel
    method: EvictionMethod
    sampling: Sampling = field(default_factory=Sampling)
    on_step: StepHook | None = None
    tokenizer: Any = None
    profile: bool = False
    steady: str | None = None
    around_step: Callable[[int], AbstractContextManager[Any]] | None = None
    token_lag: int | None = None
    numerics: int = 1

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics={self.numerics!r} is not one of {NUMERICS}")
        kv_cache.check_layers(self.model.config, self.model.config.name_or_path or self.model.config.model_type)
        select(self.model, EVICTING.name)
        info = sequence_info(self.model.config, 0, 0)
        self.num_layers = info.num_layers
        self.num_kv_heads = info.num_kv_heads
        self.num_query_heads = info.num_query_heads
        self.device = self.model.device
        if self.steady is None:
            self.steady = "graph" if self.device.type == "cuda" else "eager"
        if self.token_lag is None:
            self.token_lag = 4 if self.device.type == "cuda" else 0

    @property
    def profiling(self) -> bool:
        """Whether steps are timed in detail: asked for, or a step hook set (at any time) needs every step eager."""
        return self.profile or self.on_step is not None

    def check(self, prefill_len: int, max_new_tokens: int) -> None:
        """Fail now, not mid-run, if the model or the method rejects this sequence (``check_servable``)."""
        check_servable(self.model.config, self.method, prefill_len, max_new_tokens, "the prompt")

    def _forward(self, ids: list[int] | Tensor, start: int, cache: object) -> Tensor:
        """The last logits of ``ids`` (a list, or a ``(1, n)`` device tensor) fed from position ``start``."""
        input_ids = ids if isinstance(ids, Tensor) else torch.tensor([ids], device=self.device)
        position_ids = torch.arange(start, start + input_ids.shape[1], device=self.device)[None]
        output = self.model(
            input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1
        )
        return output.logits[0, -1]

    def _reconstruct(self, state: StepState, input_ids: list[int], cache: object) -> None:
        """Run the method's context-reconstruction passes over the prompt's cache, then drop their entries."""
        spec = state.driver.reconstruction
        if spec is None:
            return
        if self.tokenizer is None:
            raise ValueError(
                f"method {self.method.name!r} reconstructs the context, which needs the tokenizer — "
                "construct the Engine with tokenizer=<the model's tokenizer>"
            )
        prefill_len = len(input_ids)
        for start, end, ids in reconstruction_passes(self.tokenizer, input_ids, spec):
            state.driver.begin_reconstruction(start, end)
            with EVICTING.active(state):
                self._forward(ids, prefill_len, cache)
            state.driver.end_reconstruction()
            state.peak_bytes = max(state.peak_bytes, kv_cache.cache_bytes(cache))
            kv_cache.truncate(cache, prefill_len)

    def _clock(self) -> float:
        """Wall time once the device's queued work is done (a CUDA launch returns before it runs)."""
        synchronize(self.device)
        return time.perf_counter()

    @torch.inference_mode()
    def generate(self, request: Request) -> Generation:
        """Decode ``request`` alone: its prefill, then up to ``max_new_tokens`` steps under the method.

        Each step is one interval of ``decode_s`` (CUDA events, read once at the end). A step of the
        method's static steady state runs as ``harness.decode.steady`` builds it; any other step is
        eager. Either way the next token is chosen on the device and fed from there.
        """
        sequence = self._start(request, self.method)
        while not sequence.finished:
            around = self.around_step(sequence.step + 1) if self.around_step else contextlib.nullcontext()
            with sequence.stepping.timing(), around:
                if sequence.steady_ready():
                    sequence.steady_step()
                else:
                    position = sequence.next_step()
                    with EVICTING.active(sequence.state):
                        logits = self._forward(sequence.token_t, position, sequence.cache)
                    sequence.end_step(logits)
        return sequence.generation()

    @torch.inference_mode()
    def generate_batch(
        self, requests: Iterable[tuple[Key, Request]], batch_size: int
    ) -> Iterator[tuple[Key, Generation]]:
        """Generate every request, ``batch_size`` sequences decoding together; yields ``(key, generation)``
        as each sequence ends (not in the order given).

        Each sequence is prefilled alone and then joins the batch's decode steps, with its own copy
        of the method, keep sets, budget, positions and cache; a finished sequence's place goes to
        the next request. Every figure but the timings and (on CUDA) the allocator's peaks is the one
        ``generate`` gives the request alone; a sequence's ``decode_s`` is the wall time of the batch
        steps it took part in. A row's token is read ``token_lag`` steps late where ``generate`` would read it
        so (``_Sequence.reads_late``), the others once per step for all rows. Greedy tokens match
        ``generate``'s as long as no two logits tie within the last bits in which a matrix product of
        batch rows differs from one row's.

        Under ``numerics`` 2 a step whose rows only append attends them at once (``_shared``), and one whose
        rows are all in their methods' steady loop runs as one steady step (``_steady_rows``).
        """
        if batch_size == 1:
            for key, request in requests:
                yield key, self.generate(request)
            return
        pending = iter(requests)
        free = [self.method, *(copy.deepcopy(self.method) for _ in range(batch_size - 1))]
        active: list[tuple[Key, _Sequence]] = []
        shared: kv_cache.SharedSlots | None = None
        rows: SteadyRows | None = None
        # The rows' positions on the device: built from the host when the rows change (a copy to the device,
        # which waits on a GPU), else advanced there by one.
        placed: tuple[list[_Sequence], Tensor] | None = None
        batch_step = 0
        while True:
            while free and (item := next(pending, None)) is not None:
                key, request = item
                sequence = self._start(request, free.pop())
                if sequence.finished:
                    free.append(sequence.method)
                    yield key, sequence.generation()
                else:
                    active.append((key, sequence))
            if not active:
                return
            sequences = [sequence for _, sequence in active]
            batch_step += 1
            around = self.around_step(batch_step) if self.around_step else contextlib.nullcontext()
            start = self._clock()
            with around:
                # The rows' tokens are fed from the device. A row whose step would read its token late alone
                # reads it so here; the others are read together, once per step.
                late = [sequence.reads_late() for sequence in sequences]
                rows = self._steady_rows(sequences, rows)
                if rows is not None:
                    rows.step([sequence.count_steady() for sequence in sequences])
                    placed = None
                    unread = list(zip(sequences, late, strict=True))
                else:
                    positions = [sequence.next_step() for sequence in sequences]
                    if placed is not None and placed[0] == sequences:
                        placed[1].add_(1)
                    else:
                        placed = (sequences, torch.tensor([[position] for position in positions], device=self.device))
                    tokens = torch.cat([sequence.token_t for sequence in sequences])
                    shared = self._shared(sequences, shared)
                    with EVICTING.active(BatchState([sequence.state for sequence in sequences], shared)):
                        logits = self._forward_batch(tokens, placed[1], [s.cache for s in sequences], shared)
                    unread = [(s, late[row]) for row, s in enumerate(sequences) if s.end_step(logits[row], False)]
                if lagging := [sequence for sequence, lags in unread if lags]:
                    tokens = torch.cat([sequence.token_t for sequence in lagging]).view(-1)
                    copied = lagging[0].reader.start_copy(tokens)
                    for row, sequence in enumerate(lagging):
                        sequence.receive(sequence.reader.enqueue(*copied, row))
                if now := [sequence for sequence, lags in unread if not lags]:
                    chosen = torch.cat([sequence.token_t for sequence in now]).view(-1).tolist()
                    for sequence, token in zip(now, chosen, strict=True):
                        sequence.receive([token])
            seconds = self._clock() - start
            for sequence in sequences:
                sequence.decode_s += seconds
            if rows is not None and any(sequence.finished for sequence in sequences):
                # A finished row's figures, and the rows that go on, need their own state back.
                rows.leave()
                rows = None
            for key, sequence in [item for item in active if item[1].finished]:
                active.remove((key, sequence))
                free.append(sequence.method)
                yield key, sequence.generation()

    def generate_groups(self, groups: list[list[Request]], batch_size: int) -> Iterator[tuple[int, list[Generation]]]:
        """``generate_batch`` over groups of requests (an example's calls): yields ``(group index, its
        generations in order)`` as each group's last sequence ends."""
        flat = (
            ((number, index), request) for number, group in enumerate(groups) for index, request in enumerate(group)
        )
        done: dict[int, dict[int, Generation]] = {}
        for (number, index), generation in self.generate_batch(flat, batch_size):
            done.setdefault(number, {})[index] = generation
            if len(done[number]) == len(groups[number]):
                got = done.pop(number)
                yield number, [got[i] for i in range(len(got))]

    def _shared(self, sequences: list[_Sequence], current: kv_cache.SharedSlots | None) -> kv_cache.SharedSlots | None:
        """Under ``numerics`` 2, the rows' layers as one buffer per layer when this step only appends to
        every row's cache (``current`` while it still holds them); else None, and each row is served alone."""
        if self.numerics < 2 or not all(sequence.only_appends() for sequence in sequences):
            return None
        caches = [sequence.cache for sequence in sequences]
        if current is not None and current.holds(caches):
            return current
        if not kv_cache.SharedSlots.fits(caches):
            return None
        return kv_cache.SharedSlots(caches, self.num_query_heads // self.num_kv_heads)

    def _steady_rows(self, sequences: list[_Sequence], current: SteadyRows | None) -> SteadyRows | None:
        """Under ``numerics`` 2, the rows as one steady step (``SteadyRows``) when every row is in its method's
        steady loop and the methods stack (``current`` while its rows are these); else None (``current`` left),
        and each row is served alone."""
        if self.numerics < 2:
            return None
        if current is not None:
            if current.sequences == sequences:
                return current
            current.leave()
        if not all(sequence.steady_ready() for sequence in sequences):
            return None
        if not kv_cache.RowSlots.fits([sequence.cache for sequence in sequences]):
            return None
        methods, steps = [sequence.method for sequence in sequences], [sequence.step + 1 for sequence in sequences]
        stack = methods[0].stack(methods, steps)
        return None if stack is None else SteadyRows(self.model, sequences, stack, self.steady)

    def _forward_batch(
        self, input_ids: Tensor, position_ids: Tensor, caches: list[object], shared: kv_cache.SharedSlots | None
    ) -> Tensor:
        """One decode step of several sequences: row i feeds ``input_ids[i]`` at ``position_ids[i]`` (on the device)."""
        cache = kv_cache.batch_cache(self.model, caches, shared)
        output = self.model(
            input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1
        )
        return output.logits[:, -1]

    def _start(self, request: Request, method: EvictionMethod) -> _Sequence:
        """Prefill ``request`` under ``method`` (its prefill-time eviction included) and choose its first token."""
        input_ids, max_new_tokens = request.input_ids, request.max_new_tokens
        if not input_ids:
            raise ValueError("empty prompt: the engine needs at least one prompt token")
        if request.forced is not None:
            max_new_tokens = len(request.forced)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        prefill_len = len(input_ids)
        check_length(self.model.config, prefill_len, max_new_tokens, "the prompt")
        info = sequence_info(
            self.model.config, prefill_len, max_new_tokens, request.seed, self.device, self.model, self.numerics
        )
        # The last sampled token is never fed: L0 + max_new_tokens - 1 entries at most.
        most = prefill_len + max_new_tokens - 1
        _reset_peak(self.device)
        start = self._clock()
        driver = Driver(method, info, refill=True, profile=self.profiling)
        budget = method.budget()
        # Room for the prompt and the first step's token, or for the cache's growth up to the budget.
        capacity = most if budget is None else min(most, max(prefill_len + 1, budget + 1))
        cache = kv_cache.new_cache(self.model, capacity, most, padded_heads=self.numerics >= 2)
        state = StepState(driver, cache, numerics=self.numerics)
        with EVICTING.active(state):
            logits = self._forward(input_ids, 0, cache)
        state.peak_bytes = max(state.peak_bytes, kv_cache.cache_bytes(cache))
        full_token_bytes = kv_cache.bytes_per_token(cache)
        self._reconstruct(state, input_ids, cache)
        if (plan := state.driver.end_prefill()) is not None:
            kv_cache.evict(cache, plan)
        sequence = _Sequence(self, request, method, state, max_new_tokens)
        sequence.prefill_s = self._clock() - start
        sequence.prefill_peak = _peak(self.device, state.peak_bytes)
        sequence.full_token_bytes = full_token_bytes
        if self.on_step:
            self.on_step(0, state, cache)
        _reset_peak(self.device)
        sequence.decode_peak = kv_cache.cache_bytes(cache)
        sequence.take(logits)
        return sequence


Key = TypeVar("Key")


@dataclass
class Request:
    """One sequence to decode (``Engine.generate``, ``Engine.generate_batch``).

    Generation ends at a token in ``stop_token_ids`` (kept in the tokens) or when ``stop(tokens)``
    says so (stop strings), and after ``max_new_tokens`` at the latest. With ``forced``, those tokens
    are fed instead of sampled ones (teacher forcing; ``max_new_tokens`` and stops ignored) and the
    log-probability of each is returned; the method evicts exactly as in generation. Until
    ``min_new_tokens`` tokens exist, stop tokens cannot be sampled and stop strings are not checked.
    ``sampling`` replaces the engine's for this sequence; ``seed`` seeds its draws.
    """

    input_ids: list[int]
    max_new_tokens: int
    stop_token_ids: set[int] | frozenset[int] = frozenset()
    stop: Callable[[list[int]], bool] | None = None
    seed: int = 0
    forced: list[int] | None = None
    min_new_tokens: int = 0
    sampling: Sampling | None = None


class _Sequence:
    """One sequence between its prefill and its last token: the method serving it, its cache and figures."""

    def __init__(self, engine: Engine, request: Request, method: EvictionMethod, state: StepState, limit: int) -> None:
        self.engine, self.request, self.method, self.state = engine, request, method, state
        self.cache = state.cache
        self.limit = limit
        self.sampling = request.sampling or engine.sampling
        self.stops = frozenset() if request.forced is not None else frozenset(request.stop_token_ids)
        self.stop = None if request.forced is not None else request.stop
        self.generator: torch.Generator | None = None
        self.tokens: list[int] = []
        self.target_logprobs: list[float] = []
        self.target_greedy: list[bool] = []
        self.step = 0
        # Per decode step: the cache's bytes after the forward, and its longest layer after the eviction.
        # Kept per step, so a step run past a stop (a token read late) counts in neither figure.
        self.step_bytes: list[int] = []
        self.step_lengths: list[int] = []
        self.evicting = Stopwatch(engine.device) if engine.profiling else Unclocked()
        # One interval per decode step (batch steps add their wall time to ``decode_s`` instead).
        self.stepping = Stopwatch(engine.device)
        self.prefill_s = self.decode_s = 0.0
        self.prefill_peak = self.decode_peak = self.full_token_bytes = 0
        # The token the next step feeds and its position, on the device: chosen there, fed from there.
        self.token_t = torch.zeros(1, 1, dtype=torch.long, device=engine.device)
        self.position_t = torch.zeros((), dtype=torch.long, device=engine.device)
        self.loop: SteadyLoop | None = None
        self.steady_figures: tuple[int, int] | None = None
        # Whether no layer has a logit bias, asked once the cache only appends (a bias no longer changes then).
        self.unbiased: bool | None = None
        self.reader = TokenReader(engine.device, engine.token_lag)
        self.stopped = False

    @property
    def finished(self) -> bool:
        """A stop was read, or enough steps were launched (some of whose tokens may still be on their way)."""
        return self.stopped or len(self.tokens) + len(self.reader) >= self.limit

    def receive(self, tokens: list[int]) -> None:
        """Take the tokens the host has read, in order, up to the first that ends the sequence (the rest came
        from steps run past the stop, and are discarded)."""
        for token in tokens:
            if self.stopped:
                return
            self.tokens.append(token)
            if len(self.tokens) >= self.request.min_new_tokens:
                self.stopped = token in self.stops or bool(self.stop and self.stop(self.tokens))

    def take(self, logits: Tensor, read: bool = True) -> bool:
        """Append the next token: sampled from ``logits`` on the device (and fed from there), or the forced one
        (its log-probability recorded). Without ``read`` a sampled token is left for the caller to read and
        ``receive`` (a batch reads its rows at once); whether it was left so."""
        forced = self.request.forced
        if forced is not None:
            target = forced[len(self.target_logprobs)]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            self.target_logprobs.append(float(logprobs[target]))
            self.target_greedy.append(int(logprobs.argmax()) == target)
            self.receive([target])
            self.token_t.fill_(target)
            return False
        if self.generator is None:
            # On the logits' device: a sharded model's last layer may sit elsewhere than its first.
            self.generator = torch.Generator(device=logits.device).manual_seed(self.request.seed)
        if len(self.tokens) + len(self.reader) < self.request.min_new_tokens and self.stops:
            logits = logits.index_fill(0, torch.tensor(sorted(self.stops), device=logits.device), -torch.inf)
        self.token_t.copy_(self.sampling.next_token(logits, self.generator).view(1, 1))
        if not read:
            return True
        if self.method.appends_only():
            # A cache that only grows can be cut back after steps run past a stop: read the token late.
            self.receive(self.reader.push(self.token_t))
        else:
            self.receive([host_token(self.token_t)])
        return False

    def reads_late(self) -> bool:
        """Whether the host may read the next step's token ``lag`` steps late, as ``generate`` does: a cache that
        only grows is cut back after the steps run past a stop, and a steady step runs past it alone too."""
        return self.reader.lag > 0 and (self.method.appends_only() or self.steady_ready())

    def only_appends(self) -> bool:
        """Whether this step only appends to the cache: the method evicts and masks nothing more
        (``appends_only``), and neither observes nor scores the step."""
        driver = self.state.driver
        if driver.observing or driver.attention or not self.method.appends_only():
            return False
        if self.unbiased is None:
            self.unbiased = all(driver.bias(layer) is None for layer in range(self.engine.num_layers))
        return self.unbiased

    def steady_ready(self) -> bool:
        """Whether the next step is a steady one (``harness.decode.steady``): the method's static loop,
        greedy, nothing forced or suppressed, not profiled."""
        if self.loop is not None or self.state.driver.table is not None:
            return True
        engine, request, driver = self.engine, self.request, self.state.driver
        plain = not engine.profiling and self.sampling.temperature == 0.0 and request.forced is None
        plain = plain and len(self.tokens) >= request.min_new_tokens
        return plain and driver.steady() and kv_cache.ModelSlots.fits(self.cache, driver.method.budget())

    def steady_step(self) -> None:
        """One step of the static loop; the host only counts it and reads the token it chose."""
        if self.loop is None:
            self.position_t.fill_(self.state.driver.info.prefill_len + self.step)
            self.loop = SteadyLoop(self.engine.model, self, self.engine.steady)
        observing = self.count_steady()
        with EVICTING.active(self.state):
            self.loop.run(observing)
        self.receive(self.reader.push(self.token_t))

    def count_steady(self) -> bool:
        """The host's part of a steady step (alone or in a batch's ``SteadyRows``): count it; whether the method
        observes it."""
        if self.steady_figures is None:
            # What the eager steps measure at every step is constant in the steady state: measured once.
            cache = self.cache
            self.steady_figures = (
                kv_cache.cache_bytes(cache) + kv_cache.bytes_per_token(cache),
                max(kv_cache.cache_lengths(cache)),
            )
        self.step_bytes.append(self.steady_figures[0])
        self.step_lengths.append(self.steady_figures[1])
        self.step += 1
        driver = self.state.driver
        driver.next_step()
        return driver.observing

    def next_step(self) -> int:
        """Start the next decode step; the position of the token it feeds (``token_t``)."""
        self.step += 1
        self.state.driver.next_step()
        return self.state.driver.info.prefill_len + self.step - 1

    def end_step(self, logits: Tensor, read: bool = True) -> bool:
        """After the step's forward: evict as the method says, then take the next token from ``logits``
        (``take``: whether it is left unread)."""
        cache = self.cache
        self.step_bytes.append(kv_cache.cache_bytes(cache))
        if (plan := self.state.driver.end_step()) is not None:
            with self.evicting.timing():
                kv_cache.evict(cache, plan)
        self.step_lengths.append(max(kv_cache.cache_lengths(cache)))
        if self.engine.on_step:
            self.engine.on_step(self.step, self.state, cache)
        return self.take(logits, read)

    def generation(self) -> Generation:
        self.receive(self.reader.drain())
        if self.loop is not None:
            self.loop.leave()
        method, cache, driver = self.method, self.cache, self.state.driver
        steps = len(self.tokens) - 1
        if self.step > steps and method.appends_only():
            # Steps run past a stop grew a cache that only grows: their entries, the newest, go.
            kv_cache.drop_newest(cache, self.step - steps)
            driver.drop_newest(self.step - steps)
        state_bytes = method.state_bytes()
        prefill_len = driver.info.prefill_len
        return Generation(
            tokens=self.tokens,
            new_tokens=len(self.tokens),
            prefill_len=prefill_len,
            budget=method.budget(),
            cache_len_final=max(kv_cache.cache_lengths(cache)),
            kv_entries_final=visible_entries(driver, cache),
            kv_entries_held=held_entries(cache),
            kv_bytes_final=kv_cache.cache_bytes(cache) + state_bytes,
            # Steps run past a stop (a token read late) fed tokens no record keeps.
            kv_bytes_full=self.full_token_bytes * (prefill_len + len(self.tokens) - 1),
            prefill_peak_bytes=self.prefill_peak,
            decode_peak_bytes=_peak(self.engine.device, max([self.decode_peak, *self.step_bytes[:steps]])),
            prefill_s=self.prefill_s,
            decode_s=self.decode_s + self.stepping.seconds,
            score_s=driver.score_s,
            prefill_score_s=driver.prefill_score_s,
            evict_s=self.evicting.seconds,
            max_cache_len=max([0, *self.step_lengths[:steps]]),
            state_bytes=state_bytes,
            slot_bytes_final=kv_cache.held_bytes(cache),
            target_logprobs=self.target_logprobs,
            target_greedy=self.target_greedy,
            method_report=method.report(),
        )
