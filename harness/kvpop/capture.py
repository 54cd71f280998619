"""Capture post-RoPE queries, keys and values of a frozen model through an attention function of our own.

``kvpop_capture`` is registered with transformers' ``AttentionInterface``; while a ``Capture`` is
active it records every layer's ``(query, key, value)`` (keys/values per KV head, not repeated)
and then computes attention with SDPA as usual. The engine's ``evictbench`` function is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "kvpop_capture"


@dataclass
class Capture:
    """Per layer: ``queries (H, S, D)``, ``keys``/``values`` ``(Hkv, S, D)`` of batch row 0, and the scale."""

    queries: dict[int, Tensor] = field(default_factory=dict)
    keys: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)
    scaling: float = 1.0


_ACTIVE: Capture | None = None


def capturing_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if _ACTIVE is not None:
        layer = module.layer_idx
        _ACTIVE.queries[layer], _ACTIVE.keys[layer], _ACTIVE.values[layer] = query[0], key[0], value[0]
        _ACTIVE.scaling = scaling
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


AttentionInterface.register(NAME, capturing_attention)


@contextmanager
def attention_function(model: PreTrainedModel, name: str) -> Iterator[None]:
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.inference_mode()
def capture(model: PreTrainedModel, ids: list[int]) -> Capture:
    """Run ``model`` over ``ids`` (one sequence, no cache) and return every layer's q/k/v."""
    global _ACTIVE
    record = Capture()
    _ACTIVE = record
    try:
        with attention_function(model, NAME):
            model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    finally:
        _ACTIVE = None
    return record
