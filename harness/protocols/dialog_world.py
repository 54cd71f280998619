"""An eviction method served to the synthetic dialog world (``tasks.dialogs``) through the engine's driver.

The world knows nothing of methods: it asks a ``CachePolicy`` (tensors in, positions out).
``MethodPolicy`` answers with the same ``methods.driver.Driver`` the engine uses, on a
one-layer model whose KV heads are the dialogs. The world fixes the budget, so a method with a
``selection`` gets ``budget_tokens`` (its config's ``rho`` is of a prompt, meaningless here),
and, when several dialogs run at once, per-head granularity: in a one-layer one-head world
token, layer and head granularity coincide, and per-head state keeps the dialogs apart.
A world step that brings a whole turn is one driver step of that many tokens: its queries'
causal weights stand where a decode step's query group would (``methods.base.LayerView``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from torch import Tensor

from harness.record.schema import Outcome
from methods.base import EvictionMethod, LayerView, SequenceInfo
from methods.driver import Driver
from tasks.base import Example, Task


def for_world(method: EvictionMethod, budget: int, per_head: bool) -> EvictionMethod:
    """The same method with the world's fixed budget (and per-head granularity with ``per_head``)."""
    selection = getattr(method, "selection", None)
    if selection is None or not dataclasses.is_dataclass(method):
        return method
    changes: dict[str, object] = {"budget_tokens": budget, "rho": 0.0}
    if per_head:
        changes["granularity"] = "head"
    return dataclasses.replace(method, selection=dataclasses.replace(selection, **changes))


class MethodPolicy:
    """``tasks.dialogs.policy.CachePolicy`` for an eviction method."""

    def __init__(self, method: EvictionMethod) -> None:
        self.method = method
        self._adapted: dict[tuple[int, bool], EvictionMethod] = {}
        self.method_s = 0.0

    def start(self, n: int, prompt_len: int, new_tokens: int, budget: int, seed: int) -> None:
        key = (budget, n > 1)
        if key not in self._adapted:
            self._adapted[key] = for_world(self.method, budget, per_head=n > 1)
        info = SequenceInfo(prompt_len, 1, n, n, new_tokens, seed)
        start = time.perf_counter()
        self.driver = Driver(self._adapted[key], info)
        self.method_s = time.perf_counter() - start

    @property
    def positions(self) -> Tensor:
        return self.driver.positions[0]

    def prefill(self, keys: Tensor, values: Tensor, queries: Tensor, scaling: float, embeddings: Tensor) -> None:
        start = time.perf_counter()
        wanted = self.driver.prefill_queries
        if wanted:
            view = LayerView(
                0,
                keys,
                values,
                self.positions,
                queries=queries[:, -wanted:],
                scaling=scaling,
                seen=self.driver.seen,
                embeddings=embeddings,
            )
            self.driver.observe_prefill(view)
        self.driver.end_prefill()
        self.method_s += time.perf_counter() - start

    def next_step(self, tokens: int) -> None:
        self.driver.next_step(tokens)

    def wants_weights(self) -> bool:
        return self.driver.attention

    def bias(self) -> Tensor | None:
        return self.driver.bias(0)

    def step(
        self, keys: Tensor, values: Tensor, weights: Tensor | None, queries: Tensor, scaling: float, embeddings: Tensor
    ) -> None:
        start = time.perf_counter()
        if self.driver.observing:
            view = LayerView(
                0,
                keys,
                values,
                self.positions,
                weights=weights,
                queries=queries,
                scaling=scaling,
                seen=self.driver.seen,
                embeddings=embeddings,
            )
            self.driver.observe(view)
        self.driver.end_step()
        self.method_s += time.perf_counter() - start

    def probes(self) -> dict[str, Tensor]:
        """Per dialog, the state a method exposes after a step through ``probes()`` (FD-KVC: its
        ownership loss and adaptive rate), as ``(layers, kv_heads)`` tensors; layer 0 here."""
        probes = getattr(self.driver.method, "probes", None)
        return {name: value[0] for name, value in probes().items()} if probes is not None else {}


def run_in_world(task: Task, method: EvictionMethod, todo: list[Example]) -> Iterator[list[tuple[Example, Outcome]]]:
    """``WORLD``: the outcomes of ``todo`` in the task's own batches (no model), each recorded in one write."""
    for batch in task.run_batches(MethodPolicy(method), todo):
        yield [(example, Outcome.from_fields(fields)) for example, fields in batch]
