"""Everything that touches transformers' cache objects lives here.

The cache API moves between transformers releases (``past_key_values`` became ``cache`` in
5.x); keeping it in one file keeps the rest of the harness stable.

A layer whose KV heads keep different numbers of entries (a per-head budget: AdaKV, KVzip) is
stored ragged (``RaggedLayer``): the heads' entries packed one after another, so it holds
exactly the entries kept, no padding. Attention over it runs head by head
(``harness.evicting_attention``): on 2 CPU cores, per-head calls on views of the packed rows
took 0.7 ms per layer against 1.4 ms for padding the heads into one tensor per step (3 KV
heads, ~1000 entries each; 15 ms against 144 ms at 8 heads x 6400 entries), and a stored
padded layout would hold up to the longest head's length in every head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs


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


def _pack(rows: Sequence[Tensor]) -> Tensor:
    """Per-head ``(batch, T_h, D)`` rows packed along the sequence axis: ``(batch, sum T_h, D)``."""
    return torch.cat(list(rows), dim=1)


def head_views(packed: Tensor, lengths: Sequence[int]) -> tuple[Tensor, ...]:
    """Head h's ``(T_h, D)`` entries of a ragged layer's packed ``(1, sum T_h, D)`` tensor (views, no copy)."""
    return packed[0].split(list(lengths))


class RaggedLayer(DynamicLayer):
    """A cache layer whose KV heads hold ``lengths[h]`` entries each, packed head after head.

    ``keys``/``values`` are ``(batch, sum lengths, head_dim)``; a new token is appended to every
    head (``update``), which keeps each head's entries in order of arrival.
    """

    def __init__(self, keys: Tensor, values: Tensor, lengths: list[int]) -> None:
        super().__init__()
        self.keys, self.values, self.lengths = keys, values, lengths
        self.device = keys.device
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        added = key_states.shape[-2]
        self.keys = _pack(self._interleave(self.keys, key_states))
        self.values = _pack(self._interleave(self.values, value_states))
        self.lengths = [length + added for length in self.lengths]
        return self.keys, self.values

    def _interleave(self, packed: Tensor, new: Tensor) -> list[Tensor]:
        rows = packed.split(self.lengths, dim=1)
        return [piece for head, row in enumerate(rows) for piece in (row, new[:, head])]

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def heads(self) -> tuple[list[Tensor], list[Tensor]]:
        """Per head, ``(batch, T_h, D)`` keys and values (views)."""
        return list(self.keys.split(self.lengths, dim=1)), list(self.values.split(self.lengths, dim=1))


def _layer_heads(layer: DynamicLayer) -> tuple[list[Tensor], list[Tensor]]:
    if isinstance(layer, RaggedLayer):
        return layer.heads()
    return list(layer.keys.unbind(1)), list(layer.values.unbind(1))


def layer_tensors(cache: DynamicCache) -> list[tuple[Tensor, Tensor]]:
    """``(keys, values)`` per layer, each ``(batch, kv_heads, T, head_dim)`` (ragged: packed ``(batch, N, D)``).

    Layers the forward has not reached yet (during the prefill) are left out.
    """
    return [(layer.keys, layer.values) for layer in cache.layers if layer.keys is not None]


def layer_heads(cache: DynamicCache, layer: int) -> tuple[list[Tensor], list[Tensor]]:
    """Layer ``layer``'s keys and values per KV head, ``(T_h, head_dim)`` each (ragged or not)."""
    keys, values = _layer_heads(cache.layers[layer])
    return [k[0] for k in keys], [v[0] for v in values]


def head_lengths(cache: DynamicCache) -> list[list[int]]:
    """Entries cached per layer and KV head."""
    return [
        list(layer.lengths) if isinstance(layer, RaggedLayer) else [layer.keys.shape[-2]] * layer.keys.shape[1]
        for layer in cache.layers
    ]


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


def evict_layer(cache: DynamicCache, layer: int, index: Tensor | tuple[Tensor, ...]) -> None:
    """Physically keep ``index`` entries of ``layer``: ``(T',)`` shared, ``(kv_heads, T')`` or ragged per-head.

    Per-head indices of different counts make the layer a ``RaggedLayer``; a ragged layer given
    equal counts becomes a plain layer again.
    """
    current = cache.layers[layer]
    if isinstance(index, Tensor) and not isinstance(current, RaggedLayer):
        # Layers of a sharded model live on different devices.
        index = index.to(current.keys.device)
        current.keys = gather_rows(current.keys, index)
        current.values = gather_rows(current.values, index)
        return
    if isinstance(index, Tensor) and index.dim() == 1:
        raise ValueError(f"layer {layer} is ragged: a keep set shared by all KV heads cannot index it")
    keys, values = _layer_heads(current)
    rows = [row.to(keys[0].device) for row in index]
    kept_keys = [head.index_select(1, row) for head, row in zip(keys, rows, strict=True)]
    kept_values = [head.index_select(1, row) for head, row in zip(values, rows, strict=True)]
    lengths = [row.numel() for row in rows]
    if len(set(lengths)) == 1:
        plain = DynamicLayer()
        plain.lazy_initialization(kept_keys[0], kept_values[0])
        plain.keys, plain.values = torch.stack(kept_keys, dim=1), torch.stack(kept_values, dim=1)
        cache.layers[layer] = plain
    else:
        cache.layers[layer] = RaggedLayer(_pack(kept_keys), _pack(kept_values), lengths)


def evict(cache: DynamicCache, plan: list[Tensor | tuple[Tensor, ...]]) -> None:
    """Physically keep ``plan[layer]`` entries of every layer."""
    for layer, index in enumerate(plan):
        evict_layer(cache, layer, index)


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` entries of every (plain) layer, in new tensors: the rest is released."""
    for layer in cache.layers:
        layer.keys = layer.keys[..., :length, :].clone()
        layer.values = layer.values[..., :length, :].clone()


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of keys and values held now (a ragged layer holds exactly its entries)."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layer_tensors(cache))


def cache_lengths(cache: DynamicCache) -> list[int]:
    """Entries cached per layer, the longest KV head's."""
    return [max(lengths) for lengths in head_lengths(cache)]


def bytes_per_token(cache: DynamicCache) -> int:
    """Bytes one token occupies in a full cache (keys and values of every layer and KV head)."""
    total = 0
    for layer, lengths in zip(cache.layers, head_lengths(cache), strict=True):
        entry = layer.keys.shape[-1] * layer.keys.element_size() + layer.values.shape[-1] * layer.values.element_size()
        total += len(lengths) * entry
    return total
