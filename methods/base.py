"""The interface between the decoding engine and an eviction method.

A method sees tensors only: the attention of the current query (a by-product of the
attention the model computes anyway), keys, values and the absolute positions of the cached
entries. It answers with what to keep. It knows nothing of tasks or of transformers, so the
same object drives a real model (``harness.decode.engine``) and the synthetic dialog world.

Call order for one sequence::

    check(info)                              # before any weights load: refuse, or the budget
    begin(info)
    prefill forward  -> observe_prefill(view) per layer, if wants_prefill_queries
                        keep_prefill_layer(layer, positions) right after it (layer-wise prefill eviction)
    per reconstruction chunk, if reconstruction():   # KVzip's context-reconstruction passes
        forward      -> observe_reconstruction(view, start, end) per layer
    keep(step=0, positions)                  # prefill-time methods evict here
    for step t = 1, 2, ...:                  # one query per forward
        forward      -> observe(view) per layer, if observes(t)
                        logit_bias(layer, positions) per layer
        keep(step=t, positions)              # decode-time methods evict here

A caller whose steps bring several tokens at once (the dialog world's whole turns) advances
``t`` by their count, so ``prefill_len + t`` is always the number of tokens seen.

The steady state. Once every layer holds exactly its budget B, a method that evicts one entry per
row at every step is in a static loop: each step appends one entry (B + 1), observes, and gives one
back. A method that says so (``steady()``) is then served without ``keep``: the engine keeps the
positions in one ``(layers', rows, B + 1)`` table (``keep_shape``: one layer for a keep shared by all
layers, one row for a keep shared by a layer's KV heads) whose last slot holds the newest entry, and
each step asks ``evict_one`` for the slot each row gives up. Nothing in that step reads the host, so
on a GPU it is captured as a graph, one per path (a step that observes, and one that does not)::

    while steady():
        forward      -> observe(view) per layer, if observes(t)
        evict_one(table, seen, observed=observes(t))     # (layers', rows, 1) slots, on the device

Several sequences decoding together (a batch, ``numerics`` 2) whose rows are all in that loop, with
the same options, are served as one: ``stack`` the rows' methods into a ``RowStack``, whose ``observe``
and ``evict_one`` take every row at once (a leading row dimension N), and ``unstack`` when the rows
change. Rows that observe at different steps (Lazy-r's, joined at different times) follow the stack's
own schedule, on the device; the host only says whether some rows observe, or every one::

    stack = methods[0].stack(methods, steps)   # steps: each row's next step; None: each row alone
    while every row is steady:
        forward      -> stack.observe(view, some) per layer, if a row observes   # view: (N, ...) tensors
        stack.evict_one(table, seen, observed, some)                           # (layers', N, rows, 1)
    stack.unstack()

A method whose decode steps only append (``appends_only()``: no budget, or a cut made at the prefill)
lets the engine read tokens late as well: steps run past a stop are cut off the cache afterwards.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class SequenceInfo:
    """What a method may know about the sequence it is about to serve.

    Parameters:
        prefill_len: L0, the prompt length.
        num_layers, num_kv_heads, num_query_heads: attention geometry (GQA when they differ).
        max_new_tokens: upper bound on generated tokens.
        seed: per-sequence seed for stochastic methods.
        device: where the cache lives.
        rope_inv_freq: the model's RoPE inverse frequencies ``(head_dim / 2,)``, and
        rope_scale: the factor its cos/sin carry (``attention_scaling``): a method that needs the
            rotation of positions not yet seen (Expected Attention) computes it from these. None
            before the weights load and outside a model (the dialog world).
        dtype: the dtype of the cached keys and values (float32 before the weights load).
        refill: the caller stores the cache in slots (the engine): ``keep`` may answer a step that
            evicts one entry per row with a ``Refill`` per layer instead of the indices kept.
        numerics: the rounding the caller computes in (``harness.decode.engine.NUMERICS``): 1 the reference;
            from 3 a method may regroup its arithmetic into fewer kernels, which rounds otherwise.
    """

    prefill_len: int
    num_layers: int
    num_kv_heads: int
    num_query_heads: int
    max_new_tokens: int
    seed: int = 0
    device: torch.device = torch.device("cpu")
    rope_inv_freq: Tensor | None = None
    rope_scale: float = 1.0
    dtype: torch.dtype = torch.float32
    refill: bool = False
    numerics: int = 1


#: One tensor per KV head, ``(T_h, ...)``: a ragged layer, whose heads hold different counts.
PerHead = tuple[Tensor, ...]


@dataclass
class LayerView:
    """One attention layer at one step, as the method sees it.

    On a ragged layer (per-head counts differ, after a per-head budget such as AdaKV's) ``keys``,
    ``values``, ``positions`` and ``weights`` are ``PerHead`` tuples, entry h holding head h's
    ``(T_h, head_dim)``, ``(T_h,)`` or ``(group, T_h)``.

    Parameters:
        layer: layer index.
        keys, values: cached entries, ``(kv_heads, T, head_dim)``, keys after RoPE.
        positions: absolute position of every cached entry, ``(kv_heads, T)``.
        weights: softmax attention of the current query, ``(kv_heads, group, T)``, where
            ``group`` is the number of query heads sharing one KV head; ``None`` when the
            scorer asked for no attention. A step that brings Q tokens at once (the dialog
            world's whole turns, one query head per KV head) passes its Q queries' causal
            weights there instead, so a scorer pools them as it pools a group.
        queries: query rows after RoPE, ``(query_heads, Q, head_dim)``: the trailing prompt
            queries at the prefill, the current query (Q = 1) at a decode step, the step's
            queries when it brings several tokens.
        scaling: the softmax temperature the model uses (``1/sqrt(head_dim)`` usually).
        seen: tokens of the sequence so far, so every cached position is below it (the caller
            knows it without reading a device tensor; None where it does not say).
        query_mass: at the prefill, where the attention kernel can give it, a function returning
            the causal softmax weight ``queries`` pay each entry, summed over the queries,
            ``(query_heads, T)`` (None: whoever needs it computes it from the queries and keys).
        embeddings: the cached entries' own token vectors, ``(kv_heads, T, dim)``, where the
            caller has them (the dialog world, whose tokens are embeddings; None on a model).
    """

    layer: int
    keys: Tensor | PerHead
    values: Tensor | PerHead
    positions: Tensor | PerHead
    weights: Tensor | PerHead | None = None
    queries: Tensor | None = None
    scaling: float = 1.0
    seen: int | None = None
    query_mass: Callable[[], Tensor] | None = None
    embeddings: Tensor | None = None

    def to(self, device: torch.device) -> LayerView:
        """This view with its tensors on ``device``, where a method keeps its state (itself when they
        are there already): the layers of a sharded model live on different devices."""
        first = self.keys[0] if isinstance(self.keys, tuple) else self.keys
        if first.device.type == device.type and device.index in (None, first.device.index):
            return self

        def move(tensor: Tensor | PerHead | None) -> Tensor | PerHead | None:
            if isinstance(tensor, tuple):
                return tuple(row.to(device) for row in tensor)
            return None if tensor is None else tensor.to(device)

        moved = {name: move(getattr(self, name)) for name in _VIEW_TENSORS}
        return dataclasses.replace(self, **moved)


_VIEW_TENSORS = ("keys", "values", "positions", "weights", "queries", "embeddings")


@dataclass(frozen=True)
class Refill:
    """A layer loses one entry per KV head: slot ``slots[h]`` takes the entry of the last slot, and the
    layer shrinks by one.

    ``slots`` is ``(kv_heads, 1)``, or ``(1, 1)`` when every head loses the same slot. A driver made
    with ``refill=True`` (the engine, whose cache stores slots) turns a keep of all but one entry into
    this when the method does not rely on arrival order (``EvictionMethod.order_free``): one entry
    copied per head instead of a gather of the layer. The positions follow the same move. A method
    that evicts one entry per row may answer ``keep`` with it directly (``SequenceInfo.refill``).
    """

    slots: Tensor


#: What one layer keeps, as indices into its cached entries: ``(T',)`` for a set shared by all
#: KV heads, ``(kv_heads, T')`` for per-head sets of one count, or a ``PerHead`` tuple of
#: ``(T'_h,)`` indices when the counts differ (the layer is then stored ragged).
LayerKeep = Tensor | PerHead

#: Per layer, what to keep.
KeepPlan = list[LayerKeep]


@dataclass(frozen=True)
class Reconstruction:
    """Context-reconstruction passes a method asks for after the prefill (KVzip, Kim et al. 2025).

    The prompt is cut into chunks of ``chunk`` tokens; for each, the model reads the chunk again
    after an instruction to repeat it (``first`` before the first chunk, ``later`` plus the last
    ``overlap`` tokens of the previous chunk before the others), in the chat template's answer
    turn, with the prompt's cache in front. The harness tokenizes the instructions; the passes'
    entries are dropped afterwards.
    """

    chunk: int
    first: str
    later: str
    overlap: int


class EvictionMethod(ABC):
    """Base class: a method that keeps everything. Subclasses override what they need."""

    name: str = "method"

    #: Whether the method works on cached entries in any order. The engine then refills an evicted
    #: entry's slot with the last one instead of gathering the layer (``methods.driver.Refill``),
    #: so the cache is no longer in order of arrival. A method that finds its newest entries at
    #: the end of the cache leaves this False.
    order_free: bool = False

    def check(self, info: SequenceInfo) -> int | None:
        """Refuse (``ValueError``) a sequence this method cannot serve, changing no state; else the budget it
        would keep for it (``budget()`` once begun; None: no limit). Callers check every sequence before any
        weights load; ``begin`` takes its budget from here."""
        return None

    def begin(self, info: SequenceInfo) -> None:
        """Start a new sequence: drop all state from the previous one."""
        self.info = info

    @property
    def wants_prefill_queries(self) -> int:
        """How many trailing prompt queries ``observe_prefill`` needs (0: not called)."""
        return 0

    def observes(self, step: int) -> bool:
        """Whether ``observe`` runs at decode step ``step`` (1-based)."""
        return False

    def needs_attention(self, step: int) -> bool:
        """Whether ``observe`` at ``step`` needs the attention weights."""
        return False

    def observe_prefill(self, view: LayerView) -> None:
        """See one layer of the prefill (``view.queries`` holds the trailing queries)."""

    def keep_prefill_layer(self, layer: int, positions: Tensor) -> LayerKeep | None:
        """Right after ``observe_prefill`` of ``layer``: what that layer keeps, or None.

        A method answering here evicts layer by layer inside the prefill forward (kvpress's
        presses), so the cache never holds the whole prompt in every layer at once.
        """
        return None

    def reconstruction(self) -> Reconstruction | None:
        """The context-reconstruction passes to run after the prefill for this sequence, or None."""
        return None

    def observe_reconstruction(self, view: LayerView, start: int, end: int) -> None:
        """See one layer of the pass that reconstructs prompt positions ``start .. end - 1``.

        ``view.keys``/``values`` hold the prompt's entries followed by the pass's own,
        ``view.positions`` the prompt's, ``view.queries`` every query of the pass.
        """

    def observe(self, view: LayerView) -> None:
        """See one layer of a decode step."""

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        """Additive attention-logit bias ``(kv_heads, T)`` for this layer, or None."""
        return None

    @abstractmethod
    def budget(self) -> int | None:
        """Cache entries kept per layer and KV head for the current sequence (None: no limit)."""

    @abstractmethod
    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        """After the prefill (step 0) or decode step ``step``: what to keep, or None for all.

        ``positions[layer]`` is ``(kv_heads, T)``, the absolute positions now cached (a
        ``PerHead`` tuple on a ragged layer).
        """

    def appends_only(self) -> bool:
        """Whether every decode step from here on only appends its entry: nothing more is evicted or masked, and
        nothing ``report`` says changes. The engine may then run steps past a stop before it reads the
        stop, and drop their entries after (a cache without a budget; a prefill-time method's after its cut)."""
        return self.budget() is None

    def steady(self) -> bool:
        """Whether the current state is the static loop of the module docstring (nothing to evict: False)."""
        return False

    def keep_shape(self) -> tuple[int, int]:
        """``(layers', rows)`` of the steady positions table: 1 where a keep is shared (all layers, a layer's heads)."""
        raise NotImplementedError(f"method {self.name!r} has no steady state")

    def evict_one(self, positions: Tensor, seen: Tensor, observed: bool) -> Tensor:
        """At a steady step: the slot each row gives up, ``(layers', rows, 1)``, of ``positions``
        ``(layers', rows, B + 1)`` (the newest entry in the last slot); ``seen`` counts the tokens so far
        (a 0-dim device tensor); ``observed`` whether ``observe`` ran at this step. Reads nothing on the host."""
        raise NotImplementedError(f"method {self.name!r} has no steady state")

    def stack(self, methods: list[EvictionMethod], steps: list[int]) -> RowStack | None:
        """The steady loops of ``methods`` (the rows of a batch, this one first, each ``steady``, row r's next step
        ``steps[r]``) as one, or None where they cannot be (a method that has no stacked form, or options that
        differ)."""
        return None

    def state_bytes(self) -> int:
        """Bytes of per-sequence state the method holds beside the cache and must count as cache memory
        (a recurrent scorer's state); bookkeeping over positions (score vectors) is not counted."""
        return 0

    def report(self) -> dict[str, Any]:
        """What the method measured about the sequence just finished, for the record's ``meta``."""
        return {}


class RowStack(ABC):
    """The steady loops of several sequences' methods served as one (``EvictionMethod.stack``).

    The rows' states move into one tensor with a leading row dimension; ``unstack`` hands each row's back
    to its own method, which then goes on alone as if it had served every step itself.

    Attributes:
        pad: the position the stacked table's unused slots hold (row r uses its first ``B_r + 1``): a
            position no row has, whose entry is never evicted and never scored.
    """

    pad: int

    @abstractmethod
    def observe(self, view: LayerView, some: bool) -> None:
        """One layer of the step for the rows that observe it: every row, or with ``some`` those the stack's schedule
        names (each row's ``observes`` of its step; the others' state stays as it was). ``view``'s keys and values
        are ``(N, kv_heads, S, head_dim)``, positions ``(N, rows, S)`` (the table's layer), weights
        ``(N, kv_heads, group, S)``; the slots past a row's own are pads."""

    @abstractmethod
    def evict_one(self, positions: Tensor, seen: Tensor, observed: bool, some: bool) -> Tensor:
        """``EvictionMethod.evict_one`` of every row, after a step that no row (``observed`` False), some rows
        (``some``) or every row observed: ``positions`` ``(layers', N, rows, S)``, row r's newest entry in slot
        ``B_r``; ``seen`` ``(N, 1)``. The slots given up, ``(layers', N, rows, 1)``; the schedule moves on a step."""

    @abstractmethod
    def unstack(self) -> None:
        """Each row's state back to its own method."""
