"""Everything that touches transformers' cache objects lives here.

The cache API moves between transformers releases (``past_key_values`` became ``cache`` in
5.x); keeping it in one file keeps the rest of the harness stable.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


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
