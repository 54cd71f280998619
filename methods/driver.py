"""The call order of an eviction method over one sequence: one driver for every caller.

The engine (a real model), the harness's adapter of the synthetic dialog world and the unit
tests all serve a method through ``Driver``, so the order of ``methods.base`` is written once::

    driver = Driver(method, info)          # begin(info); every layer caches the prompt
    prefill forward, per layer:
        driver.observe_prefill(view)       # only if driver.prefill_queries > 0; returns the
                                           # layer's keep, if the method evicts layer by layer
    per driver.reconstruction chunk (start, end):
        driver.begin_reconstruction(start, end)
        forward, per layer: driver.observe_reconstruction(view)
        driver.end_reconstruction()        # the caller drops the pass's entries
    plan = driver.end_prefill()            # keep(0); positions follow the plan
    per decode step:
        driver.next_step()                 # the new token's position is cached; flags for this step
        forward, per layer:
            driver.bias(layer)             # additive logit bias, or None
            driver.observe(view)           # only if driver.observing
        plan = driver.end_step()           # keep(t); positions follow the plan

The caller applies each plan to its own storage (the engine gathers the model's cache); the
driver keeps the absolute positions cached per layer and the time spent inside the method. A
layer is ragged (its positions a ``PerHead`` tuple) exactly while its heads hold different
counts: a per-head keep of equal counts is stacked back into one tensor (``as_keep``), and the
cache follows the same rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from methods.base import (
    EvictionMethod,
    KeepPlan,
    LayerKeep,
    LayerView,
    PerHead,
    Reconstruction,
    Refill,
    SequenceInfo,
)
from methods.stopwatch import Stopwatch, Unclocked


def refill_of(index: Tensor, length: int) -> Refill:
    """The ``Refill`` that keeps the ``length - 1`` entries ``index`` (``(T',)`` or ``(kv_heads, T')``) names."""
    rows = index if index.dim() == 2 else index[None]
    kept = torch.zeros(rows.shape[0], length, dtype=torch.uint8, device=index.device).scatter_(1, rows, 1)
    return Refill((1 - kept).argmax(dim=1, keepdim=True))


def refill_positions(positions: Tensor, refill: Refill) -> Tensor:
    """``positions`` ``(kv_heads, T)`` after ``refill``: its slots take the last column, which goes."""
    moved = positions.clone()
    moved.scatter_(1, refill.slots.expand(positions.shape[0], 1), positions[:, -1:])
    return moved[:, :-1]


def as_keep(index: LayerKeep) -> LayerKeep:
    """``index`` with per-head indices of one count stacked into ``(kv_heads, T')``; ragged ones stay a tuple."""
    if isinstance(index, tuple) and len({row.numel() for row in index}) == 1:
        return torch.stack(index)
    return index


def gather_positions(positions: Tensor | PerHead, index: LayerKeep) -> Tensor | PerHead:
    """The kept columns of ``(kv_heads, T)`` positions (or per-head rows): ``index`` shared, per head, or ragged."""
    if isinstance(index, Tensor) and not isinstance(positions, tuple):
        return positions.index_select(1, index) if index.dim() == 1 else positions.gather(1, index)
    if isinstance(index, Tensor) and index.dim() == 1:
        raise ValueError("a keep set shared by all KV heads cannot index a ragged layer — keep per head")
    return as_keep(tuple(row.index_select(0, keep) for row, keep in zip(positions, index, strict=True)))


def append_newest(positions: Tensor | PerHead, newest: Tensor) -> Tensor | PerHead:
    """Positions with ``newest`` ``(kv_heads, k)`` appended to every head.

    Ragged rows are rebuilt as views of one buffer: one copy for all heads, not one per head.
    """
    if isinstance(positions, tuple):
        pieces = [piece for row, new in zip(positions, newest, strict=True) for piece in (row, new)]
        return torch.cat(pieces).split([row.numel() + newest.shape[1] for row in positions])
    return torch.cat([positions, newest], dim=1)


def drop_newest(positions: Tensor | PerHead, count: int) -> Tensor | PerHead:
    """Positions without the ``count`` newest of every head (the last ones: appended in order of arrival)."""
    if isinstance(positions, tuple):
        return tuple(row[: row.numel() - count] for row in positions)
    return positions[:, : positions.shape[1] - count]


def _follow(positions: Tensor | PerHead, index: LayerKeep | Refill) -> Tensor | PerHead:
    return refill_positions(positions, index) if isinstance(index, Refill) else gather_positions(positions, index)


def _per_layer(
    update: Callable[[Tensor, Tensor | None], Tensor], positions: list[Tensor], plan: KeepPlan | None = None
) -> list[Tensor]:
    """Apply ``update`` to every layer's positions, once per distinct (positions, index) pair.

    Token-level methods share one positions tensor and one keep index across all layers, so
    this does the work once instead of once per layer.
    """
    done: dict[tuple[int, int], Tensor] = {}
    result = []
    for layer, current in enumerate(positions):
        index = plan[layer] if plan is not None else None
        key = (id(current), id(index))
        if key not in done:
            done[key] = update(current, index)
        result.append(done[key])
    return result


class Driver:
    """Serves one sequence to ``method`` in the protocol's order.

    Parameters:
        method: the eviction method (``begin`` is called here).
        info: the sequence; every layer starts with positions ``0 .. prefill_len - 1``.
        refill: the caller's cache stores slots (``Refill``); granted only to an ``order_free`` method.
        profile: time the method at every decode step (``score_s``); the prefill is always timed.

    Attributes:
        positions: per layer, the ``(kv_heads, T)`` absolute positions cached now.
        table: in the steady state (``steady``), the ``(layers', rows, B + 1)`` positions the layers'
            positions are views of; its last slot holds the newest entry. None before.
        step: 0 during the prefill, t during decode step t.
        observing, attention: whether the method observes this step, and needs its weights.
        score_s: seconds inside the method (observations and keep decisions) since the prefill,
            on the device's clock (``methods.stopwatch``: CUDA events, read once at the end); None
            unless profiled.
        prefill_score_s: seconds inside the method during the prefill (its prompt observation,
            reconstruction passes and prefill keep decisions), part of the prefill's time.
    """

    def __init__(self, method: EvictionMethod, info: SequenceInfo, refill: bool = False, profile: bool = True) -> None:
        self.method = method
        self.refill = refill and method.order_free
        self.info = dataclasses.replace(info, refill=self.refill)
        self.profile = profile
        method.begin(self.info)
        prompt = torch.arange(info.prefill_len, device=info.device).expand(info.num_kv_heads, -1)
        self.positions: list[Tensor] = [prompt] * info.num_layers
        self.table: Tensor | None = None
        self.step = 0
        self.observing = False
        self.attention = False
        self.clock: Stopwatch | Unclocked = Stopwatch(info.device)
        self.prefill_score_s = 0.0
        self.reconstructing: tuple[int, int] | None = None

    @property
    def seen(self) -> int:
        """Tokens of the sequence so far: the prompt, plus one per decode step (or the step's tokens)."""
        return self.info.prefill_len + self.step

    @property
    def prefill_queries(self) -> int:
        """How many trailing prompt queries the method observes at the prefill (0: none)."""
        return self.method.wants_prefill_queries

    def observe_prefill(self, view: LayerView) -> LayerKeep | None:
        """Observe one prefill layer; what the layer keeps now if the method evicts layer by layer."""
        with self.clock.timing():
            self.method.observe_prefill(view)
            keep = self.method.keep_prefill_layer(view.layer, self.positions[view.layer])
            if keep is not None:
                keep = as_keep(keep)
                self.positions[view.layer] = gather_positions(self.positions[view.layer], keep)
        return keep

    @property
    def reconstruction(self) -> Reconstruction | None:
        """The context-reconstruction passes the method asks for after the prefill, if any."""
        return self.method.reconstruction()

    def begin_reconstruction(self, start: int, end: int) -> None:
        """The next forward reconstructs prompt positions ``start .. end - 1``."""
        self.reconstructing = (start, end)

    def observe_reconstruction(self, view: LayerView) -> None:
        with self.clock.timing():
            self.method.observe_reconstruction(view, *self.reconstructing)

    def end_reconstruction(self) -> None:
        self.reconstructing = None

    def end_prefill(self) -> KeepPlan | None:
        """The prefill-time keep plan; the time spent here belongs to the prefill, not to decoding."""
        plan = self._keep()
        self.prefill_score_s = self.clock.seconds
        self.clock = self.clock if self.profile else Unclocked()
        self.clock.reset()
        return plan

    @property
    def score_s(self) -> float | None:
        return self.clock.seconds

    def next_step(self, tokens: int = 1) -> None:
        """Start the next decode step: its ``tokens`` tokens' positions join every layer's cache.

        In the steady state the newest position is the caller's to write into the table's last slot
        (``write_newest``, on the device), so this reads nothing but host counters.
        """
        first = self.info.prefill_len + self.step
        self.step += tokens
        if self.table is None:
            newest = torch.arange(first, first + tokens, device=self.info.device).expand(self.info.num_kv_heads, -1)
            self.positions = _per_layer(lambda p, _: append_newest(p, newest), self.positions)
        self.observing = self.method.observes(self.step)
        self.attention = self.method.needs_attention(self.step)

    def steady(self) -> bool:
        """Whether the next steps are the method's static loop (``EvictionMethod.steady``) with every layer at
        its budget; the caller then serves them with ``enter_steady`` and ``steady_step``."""
        budget = self.method.budget()
        return (
            self.refill
            and self.method.steady()
            and all(isinstance(p, Tensor) and p.shape[-1] == budget for p in self.positions)
        )

    def steady_shape(self) -> tuple[int, int, int]:
        """The steady table's shape, ``(layers', rows, B + 1)``."""
        return *self.method.keep_shape(), self.positions[0].shape[-1] + 1

    def enter_steady(self, table: Tensor | None = None) -> Tensor:
        """Hold the positions in the steady table (one slot more than the budget, free) and return it: a new
        tensor, or ``table`` (of ``steady_shape``), a batch's rows' table's part for this sequence."""
        layers, rows, size = self.steady_shape()
        budget = size - 1
        if table is None:
            table = torch.zeros(layers, rows, size, dtype=torch.long, device=self.info.device)
        table[..., :budget] = torch.stack([positions[:rows] for positions in self.positions[:layers]])
        self.table = table
        heads = self.info.num_kv_heads
        self.positions = [table[layer if layers > 1 else 0].expand(heads, -1) for layer in range(self.info.num_layers)]
        return table

    def write_newest(self, position: Tensor) -> None:
        """Steady state: the newest entry's position (a 0-dim device tensor) into the table's last slot."""
        self.table.select(-1, self.table.shape[-1] - 1).fill_(position)

    def refill_table(self, slots: Tensor, position: Tensor) -> None:
        """Steady state: slot ``slots`` of each row (``evict_one``'s answer) takes the newest entry's ``position``
        (the 0-dim device tensor ``write_newest`` wrote)."""
        self.table.scatter_(2, slots, position.view(1, 1, 1).expand_as(slots))

    def leave_steady(self) -> None:
        """Back to per-layer positions of the budget's entries (the table's free slot left out)."""
        if self.table is not None:
            budget = self.table.shape[-1] - 1
            self.positions = [p[:, :budget].clone() for p in self.positions]
            self.table = None

    def bias(self, layer: int) -> Tensor | None:
        return self.method.logit_bias(layer, self.positions[layer])

    def drop_newest(self, count: int) -> None:
        """Forget the ``count`` newest entries of every row (steps run past a stop of a method that only appends)."""
        self.positions = _per_layer(lambda p, _: drop_newest(p, count), self.positions)

    def observe(self, view: LayerView) -> None:
        with self.clock.timing():
            self.method.observe(view)

    def end_step(self) -> KeepPlan | None:
        """This step's keep plan (None: keep everything)."""
        return self._keep()

    def _keep(self) -> KeepPlan | None:
        with self.clock.timing():
            plan = self.method.keep(self.step, self.positions)
        if plan is not None:
            plan = [as_keep(index) for index in plan]
            if self.refill:
                plan = self._refills(plan)
            self.positions = _per_layer(_follow, self.positions, plan)
        return plan

    def _refills(self, plan: KeepPlan) -> list[LayerKeep | Refill]:
        """``plan`` with every keep of all but one entry per head as a ``Refill`` (one per distinct keep)."""
        made: dict[int, LayerKeep | Refill] = {}
        out = []
        for index, positions in zip(plan, self.positions, strict=True):
            if id(index) not in made:
                single = isinstance(index, Tensor) and not isinstance(positions, tuple)
                single = single and positions.shape[-1] - index.shape[-1] == 1
                made[id(index)] = refill_of(index, positions.shape[-1]) if single else index
            out.append(made[id(index)])
        return out
