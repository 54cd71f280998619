"""Attention functions with per-forward state, registered with transformers: one mechanism for all.

transformers calls a registered attention function with the layer module, its post-RoPE
query and the cached keys/values, and nothing else of ours. The engine (scores from the
attention it computes, a logit bias), KVpop's activation capture and KVpop's sparse training
pattern each need state that lives for one forward; ``AttentionFunction`` carries it. This file
is the only one that touches ``AttentionInterface``, ``set_attn_implementation`` and
transformers' SDPA function, whose names and signatures move between releases.

    CAPTURE = AttentionFunction("name", forward)      # forward(state, call) -> (output, weights)
    with CAPTURE.active(state, model):                 # the model runs this function, with this state
        model(...)

Outside ``active`` (or when a model merely keeps the function selected), calls go to SDPA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

State = TypeVar("State")


@dataclass
class AttentionCall:
    """One call of an attention function by a layer: what transformers passes, in one place.

    Shapes: ``query`` ``(batch, heads, Q, head_dim)`` after RoPE, ``key``/``value``
    ``(batch, kv_heads, T, head_dim)`` (the whole cache), ``mask`` as transformers builds it.
    """

    module: torch.nn.Module
    query: Tensor
    key: Tensor
    value: Tensor
    mask: Tensor | None
    scaling: float
    kwargs: dict[str, Any]

    @property
    def layer(self) -> int:
        return self.module.layer_idx

    def sdpa(self) -> tuple[Tensor, Tensor | None]:
        """The call served by transformers' own SDPA attention (the model's default kernel)."""
        return sdpa_attention_forward(
            self.module, self.query, self.key, self.value, self.mask, 0.0, self.scaling, **self.kwargs
        )

    def causal_sdpa_with_lse(self) -> tuple[Tensor, Tensor | None]:
        """The causal call's output as ``sdpa`` returns it, and each query row's log-normaliser ``(H, Q)``.

        On CPU this is the flash kernel SDPA itself runs, called directly because only its private
        op returns the log-sum-exp (the same output, bit for bit). Elsewhere, or if a release
        drops the op, the log-normaliser is None and whoever needs it computes it.
        """
        kernel = _cpu_flash_kernel(self.query)
        if self.mask is not None or kernel is None:
            return self.sdpa()[0], None
        output, lse = kernel(self.query, self.key, self.value, 0.0, True, scale=self.scaling)
        return output.transpose(1, 2).contiguous(), lse[0]


def _cpu_flash_kernel(tensor: Tensor) -> Callable[..., tuple[Tensor, Tensor]] | None:
    if tensor.device.type != "cpu":
        return None
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def causal_column_mass(queries: Tensor, keys: Tensor, lse: Tensor, scaling: float) -> Tensor | None:
    """``sum_i softmax_i(j)``: the causal attention weight the trailing ``queries`` pay each key, per query head.

    Shapes: queries ``(H, Q, D)`` (the last Q positions), keys ``(Hkv, T, D)``, ``lse`` ``(H, Q)``
    the queries' log-normalisers (``AttentionCall.causal_sdpa_with_lse``). Returns ``(H, T)``, or None
    where the kernel is missing (not on CPU).

    The sum runs over the query axis, so it is the transposed problem: the keys attend to the
    queries, with ``-lse_i`` folded into query i as one more coordinate (``k_j . q_i * scale -
    lse_i``), and both sequences reversed so that "query i comes at or after key j" is the
    kernel's own causal mask. The kernel's log-sum-exp of that pass is ``log mass_j``: one fused
    pass, no T x T matrix in memory.
    """
    kernel = _cpu_flash_kernel(queries)
    if kernel is None:
        return None
    heads, _, dim = queries.shape
    length = keys.shape[1]
    group = heads // keys.shape[0]
    attending = torch.cat([keys.float().repeat_interleave(group, 0), keys.new_ones(heads, length, 1).float()], -1)
    attended = torch.cat([queries.float(), (-lse.float() / scaling)[..., None]], -1)
    values = attended.new_zeros(attended.shape)
    _, log_mass = kernel(attending.flip(1)[None], attended.flip(1)[None], values[None], 0.0, True, scale=scaling)
    return log_mass[0].flip(1).exp()


Forward = Callable[[Any, AttentionCall], tuple[Tensor, Tensor | None]]


def select(model: PreTrainedModel, name: str) -> None:
    """Make ``model`` call the attention function registered as ``name``."""
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)


class AttentionFunction(Generic[State]):
    """An attention function registered as ``name`` whose ``forward`` sees the state of the forward in progress.

    ``forward(state, call)`` returns what transformers expects: the output
    ``(batch, Q, heads, head_dim)`` and optional weights.
    """

    def __init__(self, name: str, forward: Forward) -> None:
        self.name = name
        self._forward = forward
        self._state: State | None = None
        AttentionInterface.register(name, self._call)

    def _call(
        self,
        module: torch.nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        call = AttentionCall(module, query, key, value, attention_mask, scaling, kwargs)
        return call.sdpa() if self._state is None else self._forward(self._state, call)

    @contextmanager
    def active(self, state: State, model: PreTrainedModel | None = None) -> Iterator[State]:
        """Serve forwards with ``state``; with ``model``, also select this function on it for the duration."""
        previous_state, self._state = self._state, state
        previous_name = model.config._attn_implementation if model is not None else None
        try:
            if model is not None:
                select(model, self.name)
            yield state
        finally:
            self._state = previous_state
            if model is not None and previous_name is not None:
                select(model, previous_name)
