"""Capture post-RoPE queries, keys and values of a frozen model through an attention function of our own.

``kvpop_capture`` (``harness.decode.attention``) records every layer's ``(query, key, value)`` (keys and
values per KV head, not repeated) into the active ``Capture``, then computes attention with SDPA
as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import PreTrainedModel

from harness.decode.attention import AttentionCall, AttentionFunction


@dataclass
class Capture:
    """Per layer: ``queries (H, S, D)``, ``keys``/``values`` ``(Hkv, S, D)`` of batch row 0, and the scale."""

    queries: dict[int, Tensor] = field(default_factory=dict)
    keys: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)
    scaling: float = 1.0


def _record(state: Capture, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
    state.queries[call.layer], state.keys[call.layer], state.values[call.layer] = (
        call.query[0],
        call.key[0],
        call.value[0],
    )
    state.scaling = call.scaling
    return call.sdpa()


CAPTURE = AttentionFunction("kvpop_capture", _record)


@torch.inference_mode()
def capture(model: PreTrainedModel, ids: list[int]) -> Capture:
    """Run ``model`` over ``ids`` (one sequence, no cache) and return every layer's q/k/v."""
    with CAPTURE.active(Capture(), model) as record:
        model(input_ids=torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=1)
    return record
