"""Everything that touches transformers' cache objects lives here.

The cache API moves between transformers releases (``past_key_values`` became ``cache`` in
5.x); keeping it in one file keeps the rest of the harness stable.

A layer whose KV heads keep different numbers of entries (a per-head budget: AdaKV, KVzip) is
stored ragged (``RaggedLayer``): the heads' entries packed one after another, so it holds
exactly the entries kept, no padding. Attention over it runs head by head
(``harness.decode.evicting_attention``): on 2 CPU cores, per-head calls on views of the packed rows
took 0.7 ms per layer against 1.4 ms for padding the heads into one tensor per step (3 KV
heads, ~1000 entries each; 15 ms against 144 ms at 8 heads x 6400 entries), and a stored
padded layout would hold up to the longest head's length in every head. On a GPU the count of
kernels matters more than that memory: ``numerics`` 2 stores such a layer padded
(``PaddedHeadsLayer``), so a step appends with one write and attends all heads in one pass.

Every other layer is a ``SlotLayer``: preallocated key/value buffers, of which the first
``length`` slots hold entries. A new token is written into the next free slot (no ``cat``, for
the full cache too). When a step evicts one entry per KV head, the engine's driver says so with
a ``Refill``: the evicted slot takes the entry of the last slot, and the layer shrinks by one
(one entry copied per head, no gather). The cache's order is then no longer arrival order, but
the driver's positions follow every move (attention is order-free once RoPE is in the keys).
Evicting more at once (the first eviction after the prefill) gathers the kept entries into
buffers of their count plus one slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from methods.base import Refill


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


#: The attribute of a cache (``new_cache``) that says its ragged layers are ``PaddedHeadsLayer``s.
PADDED_HEADS = "evictbench_padded_heads"


def new_cache(
    model: PreTrainedModel, capacity: int | None = None, limit: int | None = None, padded_heads: bool = False
) -> DynamicCache:
    """A cache for ``model``; with ``capacity``, of ``SlotLayer``s preallocated to it (growing up to ``limit``).

    A layer whose heads come to keep different counts becomes a ``RaggedLayer``, or with ``padded_heads``
    a ``PaddedHeadsLayer``.
    """
    cache = DynamicCache(config=model.config)
    if capacity is not None:
        cache.layers = [SlotLayer(capacity, limit or capacity) for _ in cache.layers]
    setattr(cache, PADDED_HEADS, padded_heads)
    return cache


class SlotLayer(DynamicLayer):
    """A layer of preallocated slots: buffers ``(batch, kv_heads, capacity, head_dim)``, the first ``length`` in use.

    ``keys``/``values`` are views of the slots in use, so code that reads a layer's tensors sees
    exactly its entries. ``limit`` is the most tokens the sequence brings; an append that outgrows
    the buffers reallocates them once for every token still to come, so a layer that stops
    evicting (a prefill-time method's, after its cut) copies itself once, not at every step.
    """

    def __init__(self, capacity: int, limit: int) -> None:
        super().__init__()
        self.capacity, self.limit, self.length = capacity, max(limit, capacity), 0
        self.planned = capacity
        self.arrived = 0
        # In the steady state (``ModelSlots``) the layer never outgrows its slots: arrivals go uncounted,
        # so a step reads no host counter that changes from step to step.
        self.counting = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        self._allocate(key_states[..., :0, :], value_states[..., :0, :], max(self.capacity, key_states.shape[-2]))
        self.is_initialized = True

    def _allocate(self, keys: Tensor, values: Tensor, capacity: int) -> None:
        """Buffers of ``capacity`` slots holding ``keys``/``values`` (``(batch, kv_heads, n, D)``) first."""
        count = keys.shape[-2]
        self._keys = keys.new_empty(*keys.shape[:2], capacity, keys.shape[-1])
        self._values = values.new_empty(*values.shape[:2], capacity, values.shape[-1])
        self._keys[..., :count, :] = keys
        self._values[..., :count, :] = values
        self.capacity, self.length = capacity, count
        self._views()

    def _views(self) -> None:
        self.keys = self._keys[..., : self.length, :]
        self.values = self._values[..., : self.length, :]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        needed = self.length + key_states.shape[-2]
        self.arrive(key_states.shape[-2])
        if needed > self.capacity:
            self._allocate(self.keys, self.values, needed + max(self.limit - self.arrived, 0))
        self._keys[..., self.length : needed, :] = key_states
        self._values[..., self.length : needed, :] = value_states
        self.appended(key_states.shape[-2])
        return self.keys, self.values

    def appended(self, count: int) -> None:
        """``count`` entries were written into the next free slots (by ``update``, or by ``SharedSlots``)."""
        self.length += count
        self._views()

    def slot_count(self) -> int:
        return self.capacity

    def head_counts(self) -> list[int]:
        """Entries per KV head."""
        return [self.length] * self._keys.shape[1]

    def has_room(self) -> bool:
        """Whether one more entry fits without reallocating."""
        return self.length < self.capacity

    def share(self, keys: Tensor, values: Tensor, filled: Tensor | None = None) -> None:
        """Move into ``keys``/``values``, its row ``(batch, kv_heads, C, D)`` of a ``SharedSlots`` or ``RowSlots``
        buffer (a ``SharedSlots``' ``filled`` counts its entries there; the layer keeps its own ``length``)."""
        keys[..., : self.length, :] = self.keys
        values[..., : self.length, :] = self.values
        self._keys, self._values = keys[..., : self.capacity, :], values[..., : self.capacity, :]
        self._views()

    def arrive(self, count: int) -> None:
        """``count`` tokens arrive (counted towards ``limit``, outside the steady state)."""
        if self.counting:
            self.arrived += count

    def refill(self, slots: Tensor) -> None:
        """Slot ``slots[h]`` of each KV head (``(kv_heads, 1)``, or ``(1, 1)`` for all) takes the entry of the
        last slot; the layer shrinks by one."""
        batch, heads, _, dim = self._keys.shape
        index = slots.to(self._keys.device).expand(heads, 1)[None, :, :, None].expand(batch, heads, 1, dim)
        last = self.length - 1
        self._keys.scatter_(2, index, self._keys[..., last : last + 1, :].clone())
        self._values.scatter_(2, index, self._values[..., last : last + 1, :].clone())
        self.length = last
        self._views()

    def compact(self, index: Tensor) -> None:
        """Keep the ``index`` entries (``(T',)`` or ``(kv_heads, T')``), gathered into buffers of ``T' + 1`` slots."""
        self._allocate(gather_rows(self.keys, index), gather_rows(self.values, index), index.shape[-1] + 1)

    def drop_newest(self, count: int) -> None:
        """Drop the ``count`` newest entries (the last slots in use), keeping the buffers."""
        self.length -= count
        self._views()

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` entries, in buffers of the planned size: the slots of the rest are released."""
        self._allocate(self.keys[..., :length, :], self.values[..., :length, :], max(length, self.planned))
        self.arrived = length

    def held_bytes(self) -> int:
        return _bytes(self._keys, self._values)


class ModelSlots:
    """Every layer's slots in one buffer, for the steady state: keys and values ``(layers, batch, kv_heads,
    B + 1, head_dim)``, each layer's ``SlotLayer`` a view of its part.

    A steady step evicts one entry per layer and KV head; refilling every layer is then one ``scatter_``
    of keys and one of values instead of two per layer. Made when each layer holds exactly its
    budget in ``B + 1`` slots (the engine's steady state); a layer reallocated later would leave it.
    """

    def __init__(self, cache: DynamicCache) -> None:
        self.layers: list[SlotLayer] = list(cache.layers)
        self.keys = torch.stack([layer._keys for layer in self.layers])
        self.values = torch.stack([layer._values for layer in self.layers])
        for index, layer in enumerate(self.layers):
            layer._keys, layer._values, layer.counting = self.keys[index], self.values[index], False
            layer._views()

    @staticmethod
    def fits(cache: DynamicCache, budget: int) -> bool:
        """Whether every layer of ``cache`` holds ``budget`` entries in ``budget + 1`` slots."""
        return all(
            isinstance(layer, SlotLayer) and layer.length == budget and layer.capacity == budget + 1
            for layer in cache.layers
        )

    def refill(self, slots: Tensor) -> None:
        """Slot ``slots[l, h]`` of every layer and KV head takes the last slot's entry; every layer shrinks by one.

        ``slots`` is ``(layers', rows, 1)``: one layer or all of them, one row or one per KV head.
        """
        layers, batch, heads, size, dim = self.keys.shape
        index = slots.to(self.keys.device)[:, None, :, :, None].expand(layers, batch, heads, 1, dim)
        last = size - 1
        self.keys.scatter_(3, index, self.keys[:, :, :, last:, :].clone())
        self.values.scatter_(3, index, self.values[:, :, :, last:, :].clone())
        for layer in self.layers:
            layer.length = last
            layer._views()


class SharedSlots:
    """The layers of several sequences in one buffer per layer, ``(rows, kv_heads, C, head_dim)``, for batch steps
    that only append (``numerics`` 2).

    Each sequence's layer (a ``SlotLayer`` or a ``PaddedHeadsLayer``) moves into its row, up to its own
    size, so its lengths, entries and held bytes stay its own. A step writes every row's entry with one
    write per layer at each row's and head's ``filled`` count (``append``), and attention reads all rows
    in one pass masked past those counts (``attended``), where a batch step otherwise serves each row
    alone. The counts of every layer are one tensor ``(layers, rows, kv_heads)``: the first layer's append
    computes the step's mask for every layer at once, and the last layer's advances every count, so a
    step's bookkeeping is two kernels, not four a layer. The mask is per row where every head of a row
    holds as many entries (slot layers: ``layers x rows x C`` bytes, 17 MB for 8 rows of 64k slots on
    Llama-3.1-8B), and per query head where padded heads differ. Made when the rows change; a row layer
    that reallocates (it outgrew its slots) leaves it, and ``holds`` then says so.

    Parameters:
        caches: the rows' caches.
        group: query heads per KV head (the mask is the query heads').
    """

    def __init__(self, caches: Sequence[DynamicCache], group: int) -> None:
        self.caches = list(caches)
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        layers = [[cache.layers[layer] for cache in self.caches] for layer in range(len(self.caches[0].layers))]
        device = layers[0][0]._keys.device
        self.filled = torch.tensor([[member.head_counts() for member in members] for members in layers], device=device)
        for layer, members in enumerate(layers):
            shape = members[0]._keys.shape
            size = max(member.slot_count() for member in members)
            keys = members[0]._keys.new_zeros(len(members), shape[1], size, shape[-1])
            values = members[0]._values.new_zeros(len(members), shape[1], size, members[0]._values.shape[-1])
            for row, member in enumerate(members):
                member.share(keys[row : row + 1], values[row : row + 1], self.filled[layer, row])
            self.keys.append(keys)
            self.values.append(values)
        self._slots = torch.arange(max(keys.shape[2] for keys in self.keys), device=device)
        # Heads and query heads per head the mask tells apart: one for all where a row's heads are equal.
        ragged = any(isinstance(member, PaddedHeadsLayer) for members in layers for member in members)
        self._masked = (self.filled.shape[2], group) if ragged else (1, 1)
        self._rows = torch.arange(len(self.caches), device=device)[:, None]
        self._heads = torch.arange(self.keys[0].shape[1], device=device)[None, :]
        self._attended: Tensor | None = None

    @staticmethod
    def fits(caches: Sequence[DynamicCache]) -> bool:
        """Whether every layer of ``caches`` can share (a slot or padded layer) and has room for one more entry."""
        return all(isinstance(layer, SHAREABLE) and layer.has_room() for cache in caches for layer in cache.layers)

    def holds(self, caches: Sequence[DynamicCache]) -> bool:
        """Whether these are its rows, every layer still in its buffer with room for one more entry."""
        return [id(cache) for cache in caches] == [id(cache) for cache in self.caches] and all(
            _shares(layer._keys, self.keys[index]) and layer.has_room()
            for cache in caches
            for index, layer in enumerate(cache.layers)
        )

    def append(self, layer: int, key_states: Tensor, value_states: Tensor) -> tuple[Tensor, Tensor]:
        """Write row r's ``(rows, kv_heads, 1, head_dim)`` entry into each head h's slot ``filled[layer, r, h]``: the
        rows' keys and values up to the longest head. The layers of a step append in order."""
        filled = self.filled[layer]
        if layer == 0:
            # Each layer's slots up to its new entry: the step's counts before it, for every layer in one kernel.
            heads, group = self._masked
            counts = self.filled[:, :, :heads, None, None]
            self._attended = self._slots <= counts.expand(*counts.shape[:3], group, 1)
        self.keys[layer][self._rows, self._heads, filled] = key_states[:, :, 0]
        self.values[layer][self._rows, self._heads, filled] = value_states[:, :, 0]
        if layer == len(self.keys) - 1:
            self.filled += 1
        members = [cache.layers[layer] for cache in self.caches]
        for member in members:
            member.arrive(1)
            member.appended(1)
        longest = max(member.get_seq_length() for member in members)
        return self.keys[layer][..., :longest, :], self.values[layer][..., :longest, :]

    def attended(self, layer: int, length: int) -> Tensor:
        """SDPA's boolean mask of this step's layer ``layer``, ``(rows, H, 1, length)`` or ``(rows, 1, 1, length)``
        where a row's heads are equal: True up to each row's and KV head's new entry (a view of the step's mask)."""
        assert self._attended is not None, "a step's first layer appends before any layer attends"
        rows, (heads, group) = self._attended.shape[1], self._masked
        return self._attended[layer, ..., :length].reshape(rows, heads * group, 1, length)


class RowSlots:
    """The steady caches of several sequences in one buffer, keys and values ``(layers, N, kv_heads, S, head_dim)``,
    for batch steps whose rows are all in their steady state (``harness.decode.steady.SteadyRows``, ``numerics`` 2).

    Row r's layers hold its budget ``B_r`` in its own ``B_r + 1`` slots, views of its part of the buffer (so its
    lengths and held bytes stay its own); S is the largest row's. A step writes row r's new entry into slot
    ``B_r`` (``append``, one write per layer), attention reads every row at once, masked past each row's
    slots, and ``refill`` moves each row's newest entry into the slot it gives up, in every layer at once.
    """

    def __init__(self, caches: Sequence[DynamicCache]) -> None:
        self.caches = list(caches)
        first: SlotLayer = self.caches[0].layers[0]
        _, heads, _, dim = first._keys.shape
        layers, rows = len(self.caches[0].layers), len(self.caches)
        budgets = [cache.layers[0].length for cache in self.caches]
        size = max(budgets) + 1
        self.keys = first._keys.new_zeros(layers, rows, heads, size, dim)
        self.values = first._values.new_zeros(layers, rows, heads, size, first._values.shape[-1])
        for row, cache in enumerate(self.caches):
            for index, layer in enumerate(cache.layers):
                layer.share(self.keys[index, row : row + 1], self.values[index, row : row + 1])
        last = torch.tensor(budgets, device=first._keys.device)
        #: True past each row's slots, ``(N, S)``.
        self.free = torch.arange(size, device=last.device)[None, :] > last[:, None]
        self._write = last.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)
        self._write_values = last.view(rows, 1, 1, 1).expand(rows, heads, 1, self.values.shape[-1])
        self._newest = last.view(1, rows, 1, 1, 1).expand(layers, rows, heads, 1, dim)
        self._newest_values = last.view(1, rows, 1, 1, 1).expand(layers, rows, heads, 1, self.values.shape[-1])

    @staticmethod
    def fits(caches: Sequence[DynamicCache]) -> bool:
        """Whether every layer of ``caches`` is a slot layer of one batch row and one more slot than its entries."""
        return all(
            isinstance(layer, SlotLayer) and layer._keys.shape[0] == 1 and layer.capacity == layer.length + 1
            for cache in caches
            for layer in cache.layers
        )

    def append(self, layer: int, key_states: Tensor, value_states: Tensor) -> tuple[Tensor, Tensor]:
        """Row r's ``(N, kv_heads, 1, head_dim)`` entry into its slot ``B_r``: every row's slots of the layer."""
        self.keys[layer].scatter_(2, self._write, key_states)
        self.values[layer].scatter_(2, self._write_values, value_states)
        return self.keys[layer], self.values[layer]

    def refill(self, slots: Tensor) -> None:
        """Slot ``slots[l, r, h]`` of every layer, row and KV head takes the row's newest entry (slot ``B_r``).

        ``slots`` is ``(layers', N, rows, 1)``: one layer or all of them, one row or one per KV head.
        """
        layers, batch, heads, _, dim = self.keys.shape
        index = slots.to(self.keys.device)[..., None]
        self.keys.scatter_(3, index.expand(layers, batch, heads, 1, dim), self.keys.gather(3, self._newest))
        dim = self.values.shape[-1]
        values = self.values.gather(3, self._newest_values)
        self.values.scatter_(3, index.expand(layers, batch, heads, 1, dim), values)

    def leave(self, steps: int) -> None:
        """The ``steps`` served count as the rows' arrivals (``SlotLayer.limit``); each layer stays a view of its
        row."""
        for cache in self.caches:
            for layer in cache.layers:
                layer.arrive(steps)


def _shares(view: Tensor, buffer: Tensor) -> bool:
    """Whether ``view`` lives in ``buffer``'s memory (under inference mode a view keeps no ``_base``)."""
    return view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


class BatchLayer(DynamicLayer):
    """Layer l of several sequences decoding together: row i of a step's keys and values joins sequence
    i's own layer, which keeps its own length, slots and ragged heads.

    ``update`` returns the step's new rows only: the engine's attention reads each sequence's entries
    from its own cache (``entries``), so sequences of different lengths need no padding. With ``shared``
    (``SharedSlots``, or ``RowSlots`` for steady rows), the rows' entries are written in one go and their padded
    buffers returned.
    """

    def __init__(self, members: list[DynamicLayer], layer: int, shared: SharedSlots | RowSlots | None = None) -> None:
        super().__init__()
        self.members, self.layer, self.shared = members, layer, shared
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        if self.shared is not None:
            return self.shared.append(self.layer, key_states, value_states)
        for row, member in enumerate(self.members):
            member.update(key_states[row : row + 1], value_states[row : row + 1])
        return key_states, value_states

    def get_seq_length(self) -> int:
        return max(member.get_seq_length() for member in self.members)


def batch_cache(
    model: PreTrainedModel, caches: Sequence[DynamicCache], shared: SharedSlots | RowSlots | None = None
) -> DynamicCache:
    """One cache for a forward of several sequences, each writing into and reading from its own ``caches[i]``
    (through ``shared``'s buffers, when given)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [
        BatchLayer([member.layers[layer] for member in caches], layer, shared) for layer in range(len(cache.layers))
    ]
    return cache


def entries(cache: DynamicCache, layer: int) -> tuple[Tensor, Tensor]:
    """Layer ``layer``'s keys and values as its ``update`` returns them (a ragged layer's packed)."""
    return cache.layers[layer].keys, cache.layers[layer].values


def _bytes(keys: Tensor, values: Tensor) -> int:
    return keys.numel() * keys.element_size() + values.numel() * values.element_size()


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

    def drop_newest(self, count: int) -> None:
        """Drop the ``count`` newest entries of every head (the last of each: ``update`` appends)."""
        keys, values = self.heads()
        self.lengths = [length - count for length in self.lengths]
        self.keys = _pack([head[:, :n] for head, n in zip(keys, self.lengths, strict=True)])
        self.values = _pack([head[:, :n] for head, n in zip(values, self.lengths, strict=True)])


class PaddedHeadsLayer(DynamicLayer):
    """A ragged layer in one buffer ``(batch, kv_heads, capacity, head_dim)``, head h's first ``lengths[h]`` slots used.

    What a per-head cut makes under ``numerics`` 2 (``new_cache``), whatever the heads' counts, so a
    batch can share it (``SharedSlots``). A step appends to every head with one write
    at each head's next slot, and attention reads all heads in one masked pass
    (``harness.decode.evicting_attention``), where the packed ``RaggedLayer`` is copied whole at every
    append and attended head by head: a few kernels a layer instead of several per head. The cost
    is memory: every head holds the longest one's slots. ``keys``/``values`` are the buffers up to the
    longest head; the slots past a head's length hold zeros or dropped entries, finite either way,
    so the masked pass multiplies them by an exact 0.

    ``room`` is how many appends are still to come (the ``SlotLayer`` it replaces knew); an append
    beyond it reallocates the buffers to what is needed.
    """

    def __init__(self, keys: Sequence[Tensor], values: Sequence[Tensor], room: int) -> None:
        super().__init__()
        self.lengths = [head.shape[1] for head in keys]
        self.room = room
        self.device = keys[0].device
        self.filled = torch.tensor(self.lengths, device=self.device)
        self._heads = torch.arange(len(keys), device=self.device)[:, None]
        self._allocate(list(keys), list(values), max(self.lengths) + room)
        self.is_initialized = True

    def _allocate(self, keys: list[Tensor], values: list[Tensor], capacity: int) -> None:
        """Zeroed buffers of ``capacity`` slots per head, head h's ``(batch, T_h, D)`` entries first."""
        batch, _, dim = keys[0].shape
        self._keys = keys[0].new_zeros(batch, len(keys), capacity, dim)
        self._values = values[0].new_zeros(batch, len(values), capacity, values[0].shape[-1])
        for head, (key, value) in enumerate(zip(keys, values, strict=True)):
            self._keys[:, head, : key.shape[1]] = key
            self._values[:, head, : value.shape[1]] = value
        self._views()

    def _views(self) -> None:
        longest = max(self.lengths)
        self.keys, self.values = self._keys[..., :longest, :], self._values[..., :longest, :]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        added = key_states.shape[-2]
        self.arrive(added)
        if max(self.lengths) + added > self._keys.shape[-2]:
            keys, values = self.heads()
            self._allocate(keys, values, max(self.lengths) + added + self.room)
        slots = self.filled[:, None] + (0 if added == 1 else torch.arange(added, device=self.device))
        self._keys[:, self._heads, slots] = key_states
        self._values[:, self._heads, slots] = value_states
        self.filled += added
        self.appended(added)
        return self.keys, self.values

    def arrive(self, count: int) -> None:
        """``count`` tokens arrive: that much less room is still to come."""
        self.room = max(self.room - count, 0)

    def appended(self, count: int) -> None:
        """``count`` entries were written after each head's last, and ``filled`` advanced (by ``update``, or by
        ``SharedSlots``, whose counts ``filled`` is then a view of)."""
        self.lengths = [length + count for length in self.lengths]
        self._views()

    def slot_count(self) -> int:
        return self._keys.shape[-2]

    def head_counts(self) -> list[int]:
        """Entries per KV head."""
        return list(self.lengths)

    def has_room(self) -> bool:
        """Whether one more entry per head fits without reallocating."""
        return max(self.lengths) < self._keys.shape[-2]

    def share(self, keys: Tensor, values: Tensor, filled: Tensor) -> None:
        """Move into ``keys``/``values``, its row ``(batch, kv_heads, C, D)`` of a ``SharedSlots`` buffer, and count
        its entries in ``filled``, that buffer's row of counts."""
        size = self._keys.shape[-2]
        keys[..., :size, :] = self._keys
        values[..., :size, :] = self._values
        self._keys, self._values, self.filled = keys[..., :size, :], values[..., :size, :], filled
        self._views()

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def heads(self) -> tuple[list[Tensor], list[Tensor]]:
        """Per head, ``(batch, T_h, D)`` keys and values (views)."""
        keys = [self._keys[:, head, :length] for head, length in enumerate(self.lengths)]
        return keys, [self._values[:, head, :length] for head, length in enumerate(self.lengths)]

    def drop_newest(self, count: int) -> None:
        """Drop the ``count`` newest entries of every head (the last of each: ``update`` appends); buffers stay."""
        self.filled -= count
        self.lengths = [length - count for length in self.lengths]
        self._views()

    def held_bytes(self) -> int:
        return _bytes(self._keys, self._values)

    def entry_bytes(self) -> int:
        """Bytes of the entries in use, not of the padding."""
        entry = self._keys.shape[0] * (self._keys.shape[-1] * self._keys.element_size())
        entry += self._values.shape[0] * (self._values.shape[-1] * self._values.element_size())
        return sum(self.lengths) * entry


#: The layers whose KV heads hold different counts.
RAGGED = (RaggedLayer, PaddedHeadsLayer)
#: The layers ``SharedSlots`` can hold.
SHAREABLE = (SlotLayer, PaddedHeadsLayer)


def padded_heads(cache: DynamicCache, layer: int) -> Tensor | None:
    """Per KV head, the entries in use ``(kv_heads,)`` of ``layer`` when it is a ``PaddedHeadsLayer``, else None."""
    current = cache.layers[layer]
    return current.filled if isinstance(current, PaddedHeadsLayer) else None


def _layer_heads(layer: DynamicLayer) -> tuple[list[Tensor], list[Tensor]]:
    if isinstance(layer, RAGGED):
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
        list(layer.lengths) if isinstance(layer, RAGGED) else [layer.keys.shape[-2]] * layer.keys.shape[1]
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


def evict_layer(cache: DynamicCache, layer: int, index: Tensor | tuple[Tensor, ...] | Refill) -> None:
    """Physically keep ``index`` entries of ``layer``: ``(T',)`` shared, ``(kv_heads, T')`` or ragged per-head,
    or refill the one slot per head a ``Refill`` names.

    Per-head indices of different counts make the layer a ``RaggedLayer``; a ragged layer given
    equal counts becomes a plain layer again. In a cache with padded heads (``new_cache``), per-head
    indices of any counts make a ``PaddedHeadsLayer``.
    """
    current = cache.layers[layer]
    if isinstance(index, Refill):
        current.refill(index.slots)
        return
    if isinstance(current, SlotLayer) and isinstance(index, Tensor):
        current.compact(index.to(current.keys.device))
        return
    if isinstance(index, Tensor) and not isinstance(current, RAGGED):
        # Layers of a sharded model live on different devices.
        index = index.to(current.keys.device)
        current.keys = gather_rows(current.keys, index)
        current.values = gather_rows(current.values, index)
        return
    if isinstance(index, Tensor) and index.dim() == 1:
        if not (isinstance(current, PaddedHeadsLayer) and len(set(current.lengths)) == 1):
            raise ValueError(f"layer {layer} is ragged: a keep set shared by all KV heads cannot index it")
        index = index.expand(len(current.lengths), -1)
    keys, values = _layer_heads(current)
    rows = [row.to(keys[0].device) for row in index]
    kept_keys = [head.index_select(1, row) for head, row in zip(keys, rows, strict=True)]
    kept_values = [head.index_select(1, row) for head, row in zip(values, rows, strict=True)]
    lengths = [row.numel() for row in rows]
    if getattr(cache, PADDED_HEADS, False):
        # Heads of one count too: the layer keeps its slots for the tokens to come, and a batch can share it.
        cache.layers[layer] = PaddedHeadsLayer(kept_keys, kept_values, _room(current))
    elif len(set(lengths)) == 1:
        plain = DynamicLayer()
        plain.lazy_initialization(kept_keys[0], kept_values[0])
        plain.keys, plain.values = torch.stack(kept_keys, dim=1), torch.stack(kept_values, dim=1)
        cache.layers[layer] = plain
    else:
        cache.layers[layer] = RaggedLayer(_pack(kept_keys), _pack(kept_values), lengths)


def _room(layer: DynamicLayer) -> int:
    """How many appends ``layer`` still expects: a slot layer's tokens still to come, a padded layer's room."""
    if isinstance(layer, SlotLayer):
        return max(layer.limit - layer.arrived, 0)
    return layer.room if isinstance(layer, PaddedHeadsLayer) else 0


def evict(cache: DynamicCache, plan: list[Tensor | tuple[Tensor, ...] | Refill]) -> None:
    """Physically keep ``plan[layer]`` entries of every layer."""
    for layer, index in enumerate(plan):
        evict_layer(cache, layer, index)


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` entries of every (plain) layer, in new tensors: the rest is released."""
    for layer in cache.layers:
        if isinstance(layer, SlotLayer):
            layer.truncate(length)
        else:
            _keep_first(layer, length)


def _keep_first(layer: DynamicLayer, length: int) -> None:
    """Keep the first ``length`` entries of a plain layer, in new tensors: the rest is released."""
    layer.keys = layer.keys[..., :length, :].clone()
    layer.values = layer.values[..., :length, :].clone()


def drop_newest(cache: DynamicCache, count: int) -> None:
    """Drop the ``count`` newest entries of every layer and KV head: the last ones of a cache that has only
    appended since its last eviction. A slot layer keeps its buffers (what it holds stays what it would
    hold without them)."""
    for layer in cache.layers:
        if isinstance(layer, SlotLayer | RaggedLayer | PaddedHeadsLayer):
            layer.drop_newest(count)
        else:
            _keep_first(layer, layer.keys.shape[-2] - count)


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of the keys and values cached now: the entries, not a slot layer's free slots or a padded layer's pad."""
    return sum(
        layer.entry_bytes() if isinstance(layer, PaddedHeadsLayer) else _bytes(layer.keys, layer.values)
        for layer in cache.layers
        if layer.keys is not None
    )


def held_bytes(cache: DynamicCache) -> int:
    """Bytes the cache's buffers hold now, free slots included (a ragged layer holds exactly its entries)."""
    return sum(
        layer.held_bytes() if isinstance(layer, SlotLayer | PaddedHeadsLayer) else _bytes(layer.keys, layer.values)
        for layer in cache.layers
        if layer.keys is not None
    )


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
