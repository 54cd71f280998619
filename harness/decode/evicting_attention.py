"""The engine's attention function: scores for the method from the attention the model computes anyway.

Registered as ``evictbench`` (``harness.decode.attention``). While the engine decodes a sequence, the
forward's state is a ``StepState`` holding the method's ``Driver`` and the cache. At a decode step
(one query row) whose method wants scores, or adds a logit bias, the softmax weights are computed
explicitly, used for the output *and* handed to the method, so scoring costs no second
attention pass. A ragged layer (its KV heads hold different counts) is attended head by head, or,
stored padded (``numerics`` 2), in one masked pass.
Every other call (the prefill, steps without scoring) goes to SDPA; a decode step of several
sequences (``BatchState``) serves each row alone, over its own cache, or all rows in one masked
pass where their caches share one buffer per layer (``numerics`` 2, a step that only appends); a
prefill the method observes calls SDPA's CPU flash kernel directly, for the rows' log-normalisers it
also returns (the prompt votes' fused pass, ``harness.decode.attention.causal_column_mass``).

Prefill-time calls may evict: a method that decides layer by layer gets the layer right after
its observation and the layer's cache is cut before the next layer runs. A context-reconstruction
pass (KVzip) reads the prompt's cache with its own queries, which the method observes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from harness.decode import kv_cache
from harness.decode.attention import AttentionCall, AttentionFunction, causal_column_mass
from methods.base import LayerView, RowStack
from methods.driver import Driver


@dataclass
class StepState:
    """The state of one engine forward.

    Parameters:
        driver: serves the sequence to the method (positions, flags, timing).
        cache: the cache the forward reads and writes (layer-wise prefill eviction cuts it).
        attention_calls: decode-time explicit attention computations per layer (the test of
            "no second attention pass" counts them).
        peak_bytes: the most key/value bytes the cache held at any layer call of a multi-query
            forward (the prefill and reconstruction passes), before that layer's eviction.
        numerics: the engine's (``harness.decode.engine.NUMERICS``); from 4 the explicit attention folds its
            scale and bias into the logits' product (``query_attention``).
    """

    driver: Driver
    cache: object = None
    attention_calls: dict[int, int] = field(default_factory=dict)
    peak_bytes: int = 0
    numerics: int = 1

    @property
    def fused(self) -> bool:
        """Whether the explicit attention folds its scale and bias into the logits' product (``query_attention``)."""
        return self.numerics >= 4

    @property
    def positions(self) -> list[Tensor]:
        """Per layer, the absolute positions cached now (``Driver.positions``)."""
        return self.driver.positions

    def count_attention(self, layer: int, steady: bool) -> None:
        """Count an explicit attention computation of ``layer`` (eager steps only: a host counter in a steady
        step would change its graph at every step; the steady step's own test counts its graph instead)."""
        if not steady:
            self.attention_calls[layer] = self.attention_calls.get(layer, 0) + 1


@dataclass
class RowsStep:
    """A batch step whose rows are all in their steady state (``harness.decode.steady.SteadyRows``): their slots
    in one ``kv_cache.RowSlots``, their methods' loops stacked (``methods.base.RowStack``).

    Parameters:
        stack: the rows' methods as one.
        table: the rows' positions, ``(layers', N, rows, S)``.
        free: True past each row's slots, ``(N, S)``.
        observing, attention: whether the rows' methods observe this step, and need its weights.
        some: only some rows observe it (``RowStack.observe``).
        fused: the explicit attention folds its scale and bias into the logits' product (``numerics`` 4).
    """

    stack: RowStack
    table: Tensor
    free: Tensor
    observing: bool
    attention: bool
    some: bool = False
    fused: bool = False

    def __post_init__(self) -> None:
        # Every KV head of a row has the same slots: the mask and the bias broadcast over heads.
        self.mask = ~self.free[:, None, None, :]
        self.bias = torch.zeros(self.free.shape, device=self.free.device).masked_fill(self.free, -torch.inf)[:, None]


@dataclass
class BatchState:
    """The state of one decode forward of several sequences (``Engine.generate_batch``): one ``StepState``
    per batch row, each with its own driver and cache, and ``shared`` when the rows' caches are one buffer
    per layer (``kv_cache.SharedSlots``: a step that only appends, ``numerics`` 2), or ``steady`` when the
    rows are all in their steady state (``numerics`` 2)."""

    states: list[StepState]
    shared: kv_cache.SharedSlots | None = None
    steady: RowsStep | None = None


def _batched(batch: BatchState, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    """Each row's query attends to its own sequence's cache, exactly as when that sequence decodes alone; or,
    over shared slots or steady rows, every row at once, masked past each row's own entries."""
    if batch.steady is not None:
        return _steady_rows(batch.steady, call)
    if batch.shared is not None:
        mask = batch.shared.attended(call.layer, call.key.shape[2])
        return dataclasses.replace(call, mask=mask).sdpa()[0], None
    outputs = []
    for row, state in enumerate(batch.states):
        key, value = kv_cache.entries(state.cache, call.layer)
        alone = dataclasses.replace(call, query=call.query[row : row + 1], key=key, value=value, mask=None)
        outputs.append(_forward(state, alone)[0])
    return torch.cat(outputs), None


def _steady_rows(step: RowsStep, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    """Every row's query over its own slots in one pass (the slots past them masked); the stacked methods
    observe the layer."""
    weights = None
    if step.attention:
        output, weights = query_attention(call.query, call.key, call.value, call.scaling, step.bias, step.fused)
    else:
        output = dataclasses.replace(call, mask=step.mask).sdpa()[0]
    if step.observing:
        positions = step.table[call.layer if step.table.shape[0] > 1 else 0]
        view = LayerView(
            call.layer, call.key, call.value, positions, weights=weights, queries=call.query, scaling=call.scaling
        )
        step.stack.observe(view, step.some)
    return output, None


def single_query_attention(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, bias: Tensor | None, fused: bool = False
) -> tuple[Tensor, Tensor]:
    """``query_attention`` of one sequence: bias ``(Hkv, T)``, weights ``(Hkv, H/Hkv, T)``."""
    output, weights = query_attention(query, key, value, scaling, None if bias is None else bias[None], fused)
    return output, weights[0]


def query_attention(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, bias: Tensor | None, fused: bool = False
) -> tuple[Tensor, Tensor]:
    """Attention of one query row per sequence with its weights, GQA-grouped without repeating keys.

    Shapes: query ``(N, H, 1, D)``, key/value ``(N, Hkv, T, D)``, bias ``(N, Hkv, T)`` (or 1 for Hkv).
    Returns the output ``(N, 1, H, D)`` (the layout attention functions return) and the
    weights ``(N, Hkv, H/Hkv, T)``. Logits and softmax are fp32 whatever the model's dtype (in bf16
    the output error was 8x SDPA's, so a scored and an unscored step ran on different numerics);
    only the value product runs in the model's dtype. The weights handed on stay fp32. On CUDA a
    half-precision product accumulates and writes fp32 itself (``out_dtype``), so the keys are not
    copied to fp32 at every scored step; elsewhere they are. ``fused`` (``numerics`` 4) folds the scale and
    the bias into the product on the CPU (``baddbmm``: one rounding where there were three, two kernels fewer).
    """
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.view(rows, kv_heads, heads // kv_heads, dim)
    if fused and not _mixed_product(key):
        logits = _fused_logits(grouped.float(), key.float(), scaling, bias)
    else:
        logits = _fp32_logits(grouped, key) * scaling
        if bias is not None:
            logits = logits + bias[:, :, None, :].float()
    weights = torch.softmax(logits, dim=-1)
    output = torch.matmul(weights.to(value.dtype), value).view(rows, heads, 1, dim).transpose(1, 2)
    return output, weights


def _mixed_product(key: Tensor) -> bool:
    """Whether the logits' product reads half-precision keys and writes fp32 itself (CUDA's ``out_dtype``)."""
    return key.is_cuda and key.dtype in (torch.bfloat16, torch.float16)


def _fused_logits(grouped: Tensor, key: Tensor, scaling: float, bias: Tensor | None) -> Tensor:
    """``scaling * grouped @ key^T + bias`` in one fp32 product, ``(N, Hkv, group, T)``."""
    rows, kv_heads, group, _ = grouped.shape
    length = key.shape[2]
    if bias is None:
        # beta = 0: the input only gives the output's shape, and a view of the queries costs no kernel.
        base, beta = grouped.flatten(0, 1)[:, :, :1], 0.0
    else:
        base, beta = bias.float()[:, :, None, :].expand(rows, kv_heads, group, length).flatten(0, 1), 1.0
    product = torch.baddbmm(
        base, grouped.flatten(0, 1), key.flatten(0, 1).transpose(-1, -2), beta=beta, alpha=scaling
    )  # fmt: skip
    return product.view(rows, kv_heads, group, length)


def _fp32_logits(grouped: Tensor, key: Tensor) -> Tensor:
    """``grouped @ key^T`` in fp32, ``(N, Hkv, group, T)``: on CUDA without an fp32 copy of the keys."""
    if _mixed_product(key):
        rows, kv_heads, group, _ = grouped.shape
        product = torch.bmm(grouped.flatten(0, 1), key.flatten(0, 1).transpose(-1, -2), out_dtype=torch.float32)
        return product.view(rows, kv_heads, group, -1)
    return torch.matmul(grouped.float(), key.float().transpose(-1, -2))


def ragged_single_query_attention(
    query: Tensor,
    keys: tuple[Tensor, ...],
    values: tuple[Tensor, ...],
    scaling: float,
    bias: tuple[Tensor, ...] | None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``single_query_attention`` over KV heads of different lengths, one head at a time.

    Shapes: query ``(1, H, 1, D)``, ``keys[h]``/``values[h]`` ``(T_h, D)``, ``bias[h]`` ``(T_h,)``.
    Returns the output ``(1, 1, H, D)`` and per head the fp32 weights ``(H/Hkv, T_h)``.
    """
    _, heads, _, dim = query.shape
    grouped = query.view(len(keys), heads // len(keys), dim)
    outputs, weights = [], []
    for head, (key, value) in enumerate(zip(keys, values, strict=True)):
        logits = torch.matmul(grouped[head].float(), key.float().transpose(0, 1)) * scaling
        if bias is not None:
            logits = logits + bias[head][None, :].float()
        head_weights = torch.softmax(logits, dim=-1)
        outputs.append(torch.matmul(head_weights.to(value.dtype), value))
        weights.append(head_weights)
    return torch.cat(outputs).view(1, 1, heads, dim), tuple(weights)


def _sdpa_mask(free: Tensor, query_heads: int) -> Tensor:
    """SDPA's boolean mask ``(rows, H, 1, T)`` from ``free`` ``(rows, Hkv, T)``, True past a KV head's entries.

    Each query head reads its KV head's row: expanded, as ``repeat_interleave`` would read its size on the host.
    """
    rows, kv_heads, length = free.shape
    grouped = free[:, :, None, :].expand(rows, kv_heads, query_heads // kv_heads, length)
    return ~grouped.reshape(rows, query_heads, 1, length)


def _padded(
    call: AttentionCall,
    filled: Tensor,
    lengths: list[int],
    bias: tuple[Tensor, ...] | None,
    scored: bool,
    fused: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...] | None]:
    """One query row over a ``PaddedHeadsLayer``'s heads in one pass: the slots past ``filled[h]`` are masked.

    ``call.key``/``call.value`` are ``(1, Hkv, T, D)``, T the longest head's length. Unless ``scored``, SDPA
    serves the step (no weights); else ``single_query_attention`` with the mask as its bias, and head h's
    weights are the first ``lengths[h]`` of its row. A method's own bias adds to the mask.
    """
    key = call.key
    free = torch.arange(key.shape[2], device=key.device) >= filled[:, None]
    if bias is not None:
        pad = [torch.nn.functional.pad(row.float(), (0, key.shape[2] - row.numel())) for row in bias]
        mask = torch.stack(pad).masked_fill(free, -torch.inf)
    elif not scored:
        return dataclasses.replace(call, mask=_sdpa_mask(free[None], call.query.shape[1])).sdpa()[0], None
    else:
        mask = torch.where(free, -torch.inf, 0.0)
    output, weights = single_query_attention(call.query, key, call.value, call.scaling, mask, fused)
    return output, tuple(weights[head, :, :length] for head, length in enumerate(lengths))


def _reconstruction(state: StepState, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    """A pass that reads the prompt's cache again: the method observes it; causal, aligned at the end."""
    driver, layer = state.driver, call.layer
    view = LayerView(
        layer,
        call.key[0],
        call.value[0],
        driver.positions[layer],
        queries=call.query[0],
        scaling=call.scaling,
        seen=driver.seen,
    )
    driver.observe_reconstruction(view)
    queries, length = call.query.shape[2], call.key.shape[2]
    # transformers builds no mask for a registered attention function, and SDPA's own causal mask
    # aligns the queries with the first keys: query i of the pass sees the cache and itself.
    rows = torch.arange(length - queries, length, device=call.query.device)
    mask = torch.arange(length, device=call.query.device)[None, :] <= rows[:, None]
    return dataclasses.replace(call, mask=mask[None, None]).sdpa()


def _prefill(state: StepState, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    driver, layer = state.driver, call.layer
    if state.cache is not None:
        state.peak_bytes = max(state.peak_bytes, kv_cache.cache_bytes(state.cache))
    if driver.reconstructing is not None:
        return _reconstruction(state, call)
    if not (wanted := driver.prefill_queries):
        return call.sdpa()
    # The prompt-attention votes need each query row's log-normaliser, which the kernel computes anyway.
    output, lse = call.causal_sdpa_with_lse()
    queries = call.query[0, :, -wanted:]
    mass = None if lse is None else partial(causal_column_mass, queries, call.key[0], lse[:, -wanted:], call.scaling)
    positions = driver.positions[layer]
    view = LayerView(
        layer,
        call.key[0],
        call.value[0],
        positions,
        queries=queries,
        scaling=call.scaling,
        seen=driver.seen,
        query_mass=mass,
    )
    keep = driver.observe_prefill(view)
    if keep is not None:
        kv_cache.evict_layer(state.cache, layer, keep)
    return output, None


def _forward(state: StepState | BatchState, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    if isinstance(state, BatchState):
        return _batched(state, call)
    if call.query.shape[0] != 1:
        return call.sdpa()
    if call.query.shape[2] > 1:
        return _prefill(state, call)
    driver, layer = state.driver, call.layer
    positions = driver.positions[layer]
    bias = driver.bias(layer)
    weights = None
    # A steady step (``harness.decode.steady``) reads no host counter that changes from step to step.
    steady = driver.table is not None
    if isinstance(positions, tuple):
        lengths = [row.numel() for row in positions]
        filled = kv_cache.padded_heads(state.cache, layer)
        if filled is None:
            key, value = kv_cache.head_views(call.key, lengths), kv_cache.head_views(call.value, lengths)
            output, weights = ragged_single_query_attention(call.query, key, value, call.scaling, bias)
        else:
            key = tuple(call.key[0, head, :length] for head, length in enumerate(lengths))
            value = tuple(call.value[0, head, :length] for head, length in enumerate(lengths))
            output, weights = _padded(call, filled, lengths, bias, driver.attention, state.fused)
        if weights is not None:
            state.count_attention(layer, steady)
    else:
        key, value = call.key[0], call.value[0]
        if not driver.attention and bias is None:
            output, _ = call.sdpa()
        else:
            output, weights = single_query_attention(call.query, call.key, call.value, call.scaling, bias, state.fused)
            state.count_attention(layer, steady)
    if driver.observing:
        seen = None if steady else driver.seen
        view = LayerView(
            layer, key, value, positions, weights=weights, queries=call.query[0], scaling=call.scaling, seen=seen
        )
        driver.observe(view)
    return output, None


EVICTING = AttentionFunction("evictbench", _forward)
