"""The engine's attention function: scores for the method from the attention the model computes anyway.

Registered as ``evictbench`` (``harness.attention``). While the engine decodes a sequence, the
forward's state is a ``StepState`` holding the method's ``Driver``. At a decode step (one query
row) whose method wants scores, or adds a logit bias, the softmax weights are computed
explicitly, used for the output *and* handed to the method, so scoring costs no second
attention pass. Every other call (the prefill, steps without scoring, batch > 1) goes to SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.attention import AttentionFunction, Call
from methods.base import LayerView
from methods.driver import Driver


@dataclass
class StepState:
    """The state of one engine forward.

    Parameters:
        driver: serves the sequence to the method (positions, flags, timing).
        attention_calls: decode-time explicit attention computations per layer (the test of
            "no second attention pass" counts them).
    """

    driver: Driver
    attention_calls: dict[int, int] = field(default_factory=dict)

    @property
    def positions(self) -> list[Tensor]:
        """Per layer, the absolute positions cached now (``Driver.positions``)."""
        return self.driver.positions


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


def _forward(state: StepState, call: Call) -> tuple[Tensor, Tensor | None]:
    if call.query.shape[0] != 1:
        return call.sdpa()
    driver, layer = state.driver, call.layer
    key, value, positions = call.key[0], call.value[0], driver.positions[layer]
    if call.query.shape[2] > 1:
        if wanted := driver.prefill_queries:
            queries = call.query[0, :, -wanted:]
            driver.observe_prefill(LayerView(layer, key, value, positions, queries=queries, scaling=call.scaling))
        return call.sdpa()
    bias = driver.bias(layer)
    weights = None
    if not driver.attention and bias is None:
        output, _ = call.sdpa()
    else:
        output, weights = single_query_attention(call.query, call.key, call.value, call.scaling, bias)
        state.attention_calls[layer] = state.attention_calls.get(layer, 0) + 1
    if driver.observing:
        view = LayerView(layer, key, value, positions, weights=weights, queries=call.query[0], scaling=call.scaling)
        driver.observe(view)
    return output, None


EVICTING = AttentionFunction("evictbench", _forward)
