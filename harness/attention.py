"""The attention function through which methods see attention without recomputing it.

Registered with transformers' ``AttentionInterface`` as ``evictbench``. While a sequence is
decoded by ``harness.engine``, a ``StepContext`` is active: at a decode step (one query row)
whose method wants scores, the softmax weights are computed explicitly, used for the output
*and* handed to the method, so scoring costs no second attention pass. Every other call
(prefill, steps without scoring, any use outside the engine) goes to SDPA unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from methods.base import EvictionMethod, LayerView

NAME = "evictbench"


@dataclass
class StepContext:
    """State the attention function needs during one forward of the engine.

    Parameters:
        method: the eviction method serving this sequence.
        positions: absolute positions of the cached entries per layer, ``(kv_heads, T)``,
            already including the tokens of the current forward.
        step: 0 for the prefill, t >= 1 for decode step t.
        observe: whether the method observes this step.
        attention: whether the method needs the attention weights this step.
        score_s: seconds spent inside the method's observation calls (accumulates).
        attention_calls: decode-time attention computations per layer (for the no-second-pass check).
    """

    method: EvictionMethod
    positions: list[Tensor]
    step: int = 0
    observe: bool = False
    attention: bool = False
    score_s: float = 0.0
    attention_calls: dict[int, int] = field(default_factory=dict)


_ACTIVE: StepContext | None = None


@contextmanager
def active(context: StepContext) -> Iterator[StepContext]:
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, context
    try:
        yield context
    finally:
        _ACTIVE = previous


def single_query_attention(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Attention of one query row with its weights, GQA-grouped without repeating keys.

    Shapes: query ``(1, H, 1, D)``, key/value ``(1, Hkv, T, D)``, bias ``(Hkv, T)``.
    Returns the output ``(1, 1, H, D)`` (the layout attention functions return) and the
    weights ``(Hkv, H/Hkv, T)``.
    """
    _, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.view(1, kv_heads, heads // kv_heads, dim)
    logits = torch.matmul(grouped, key.transpose(-1, -2)) * scaling
    if bias is not None:
        logits = logits + bias[None, :, None, :].to(logits)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).view(1, heads, 1, dim).transpose(1, 2)
    return output, weights[0]


def evicting_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    context = _ACTIVE
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if context is None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    layer = module.layer_idx
    positions = context.positions[layer]
    if query.shape[2] > 1:
        wanted = context.method.wants_prefill_queries
        if wanted:
            start = time.perf_counter()
            view = LayerView(layer, key[0], value[0], positions, queries=query[0, :, -wanted:], scaling=scaling)
            context.method.observe_prefill(view)
            context.score_s += time.perf_counter() - start
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    bias = context.method.logit_bias(layer, positions)
    if not context.attention and bias is None:
        output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        weights = None
    else:
        output, weights = single_query_attention(query, key, value, scaling, bias)
        context.attention_calls[layer] = context.attention_calls.get(layer, 0) + 1
    if context.observe:
        start = time.perf_counter()
        view = LayerView(layer, key[0], value[0], positions, weights=weights, queries=query[0], scaling=scaling)
        context.method.observe(view)
        context.score_s += time.perf_counter() - start
    return output, None


AttentionInterface.register(NAME, evicting_attention)
