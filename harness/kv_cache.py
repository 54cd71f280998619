"""Everything that touches transformers' cache objects lives here.

The cache API moves between transformers releases (``past_key_values`` became ``cache`` in
5.x); keeping it in one file keeps the rest of the harness stable.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import get_layer_types_and_kwargs


def check_layers(config: PretrainedConfig, name: str) -> None:
    """Refuse a model with a layer the engine cannot evict from (sliding-window, chunked, linear, shared).

    The cache would build such a layer as a rolling or stateful buffer, which neither keeps the
    positions the engine tracks nor can be gathered; transformers decides the layer types from
    the config, so the same function decides here.
    """
    text = config.get_text_config(decoder=True)
    layer_types, _ = get_layer_types_and_kwargs(text)
    other = sorted({kind for kind in layer_types if kind != "full_attention"})
    if not other:
        return
    # A window that only the sliding_window field sets (Mistral v0.1) can be switched off for short
    # sequences; layers that the config lists by type are part of the architecture.
    switchable = getattr(text, "layer_types", None) is None and other == ["sliding_attention"]
    fix = (
        f"set model.config.sliding_window=null if every sequence fits in its {text.sliding_window}-token window"
        if switchable
        else "use a model with full attention in every layer"
    )
    raise ValueError(
        f"model {name!r} has {', '.join(other)} layers ({layer_types.count(other[0])} of {len(layer_types)} are "
        f"{other[0]}), which the engine cannot evict from — {fix}"
    )


def new_cache(model: PreTrainedModel) -> DynamicCache:
    return DynamicCache(config=model.config)


def layer_tensors(cache: DynamicCache) -> list[tuple[Tensor, Tensor]]:
    """``(keys, values)`` per layer, each ``(batch, kv_heads, T, head_dim)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def gather_rows(tensor: Tensor, index: Tensor) -> Tensor:
    """Gather along the sequence axis (-2 of a ``(batch, heads, T, ...)`` tensor, or -1 of ``(heads, T)``).

    ``index`` is ``(T',)`` (shared by all heads) or ``(heads, T')``. The result is a new,
    smaller tensor: the old storage is released, so memory really falls.
    """
    if tensor.dim() == 2:
        return tensor.index_select(1, index) if index.dim() == 1 else tensor.gather(1, index)
    if index.dim() == 1:
        return tensor.index_select(2, index)
    # Per-head rows as one flat index_select over (heads * T) rows: several times faster than
    # torch.gather with an index expanded over head_dim.
    batch, heads, length, dim = tensor.shape
    offsets = torch.arange(heads, device=index.device)[:, None] * length
    flat = tensor.reshape(batch, heads * length, dim).index_select(1, (index + offsets).flatten())
    return flat.view(batch, heads, index.shape[1], dim)


def evict(cache: DynamicCache, plan: list[Tensor]) -> None:
    """Physically keep ``plan[layer]`` entries of every layer."""
    for layer, index in zip(cache.layers, plan, strict=True):
        # Layers of a sharded model live on different devices.
        index = index.to(layer.keys.device)
        layer.keys = gather_rows(layer.keys, index)
        layer.values = gather_rows(layer.values, index)


def cache_bytes(cache: DynamicCache) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layer_tensors(cache))


def cache_lengths(cache: DynamicCache) -> list[int]:
    return [k.shape[-2] for k, _ in layer_tensors(cache)]


def bytes_per_token(cache: DynamicCache) -> int:
    """Bytes one token occupies in a full cache (keys and values of every layer and KV head)."""
    return sum(
        (k[..., :1, :].numel() * k.element_size()) + (v[..., :1, :].numel() * v.element_size())
        for k, v in layer_tensors(cache)
    )
