"""The steady state's decode step: static shapes, nothing read on the host, one graph per path.

Once every layer holds exactly its budget B and the method's loop is static (``methods.base``:
``EvictionMethod.steady``), every step does the same work on buffers of the same size::

    the newest position into the positions table's free slot          (Driver.write_newest)
    the fed token's forward under the method (it observes at observing steps), writing slot B
    evict_one: the slot each row gives up, on the device              (EvictionMethod.evict_one)
    one refill of every layer's keys and values and of the table       (kv_cache.ModelSlots)
    the next token chosen on the device and fed from there; the position counter advances

No step reads a value on the host and no shape changes from step to step, so a step is a graph:

- ``eager``: run as it is (a CPU, where a launch costs nothing that capture would save);
- ``compiled``: ``torch.compile(fullgraph=True, dynamic=False)``, the CPU's proxy of capture: a graph
  break or a recompilation is what would break capture on a GPU (the tests run it);
- ``graph``: CUDA graphs, one per path (a step that observes and one that does not: Lazy-r has both),
  each run once as it is (its warm-up) and captured; later steps replay it.

Only greedy decoding without forced or suppressed tokens takes this step; anything else takes the
engine's eager step, which this one must equal token for token and entry for entry.

A batch (``numerics`` 2) whose rows are all in that loop takes the same step with every row in it
(``SteadyRows``): the rows' slots in one buffer padded to the largest budget, their positions in one table,
their methods stacked (``methods.base.RowStack``). Its kernels do not grow with the rows; its roundings are
not one row's (a padded softmax, a batch's products), hence ``numerics`` 2.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from harness.decode import kv_cache
from harness.decode.evicting_attention import EVICTING, BatchState, RowsStep
from methods.base import RowStack

MODES = ("eager", "compiled", "graph")


class _Paths:
    """A steady step's paths, each run as ``mode`` says: ``SteadyLoop``'s two (whether the method observes the
    step), ``SteadyRows``'s three (whether no row, some rows or every row observes it)."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"steady mode {mode!r} is not one of {MODES}")
        self.mode = mode
        self.paths: dict[int, Callable[[], None]] = {}

    def _step(self, path: int) -> None:
        raise NotImplementedError

    def run(self, path: int) -> None:
        """One steady step down ``path``."""
        run = self.paths.get(path)
        if run is not None:
            run()
            return
        if self.mode == "compiled":
            # The CPU's proxy of capture: one graph, no break; the tests forbid recompiling it.
            compiled = torch.compile(self._step, fullgraph=True, dynamic=False, backend="eager")
            self.paths[path] = lambda: compiled(path)
            self.paths[path]()
            return
        self._step(path)
        if self.mode == "graph":
            self.paths[path] = self._capture(path)
        else:
            self.paths[path] = lambda: self._step(path)

    def _capture(self, path: int) -> Callable[[], None]:
        """The path as a CUDA graph: the step just run as it is was its warm-up; capturing runs nothing."""
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            self._step(path)
        torch.cuda.current_stream().wait_stream(stream)
        return graph.replay


class SteadyLoop(_Paths):
    """The steady steps of one sequence: its slots in one buffer, its positions table, a graph per path.

    Parameters:
        model: the causal LM.
        sequence: the engine's sequence (its cache, driver, fed token and position counter).
        mode: one of ``MODES``.
    """

    def __init__(self, model: Any, sequence: Any, mode: str) -> None:
        super().__init__(mode)
        self.model, self.sequence = model, sequence
        self.slots = kv_cache.ModelSlots(sequence.cache)
        self.table = sequence.state.driver.enter_steady()

    def _step(self, observing: bool) -> None:
        sequence = self.sequence
        driver, position = sequence.state.driver, sequence.position_t
        driver.write_newest(position)
        output = self.model(
            input_ids=sequence.token_t, position_ids=position.view(1, 1), cache=sequence.cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        slots = driver.method.evict_one(self.table, position + 1, observing)
        self.slots.refill(slots)
        driver.refill_table(slots, position)
        sequence.token_t.copy_(output.logits[0, -1].argmax().view(1, 1))
        position.add_(1)

    def leave(self) -> None:
        """The sequence's positions back as per-layer tensors of the budget's entries."""
        self.sequence.state.driver.leave_steady()


class SteadyRows(_Paths):
    """The steady steps of a batch's sequences as one step (``numerics`` 2): the same step as ``SteadyLoop``'s,
    with every row in it at once.

    The rows' slots sit in one ``kv_cache.RowSlots``, their positions tables in one ``(layers', N, rows, S)``
    table (row r's first ``B_r + 1`` slots, the rest holding the stack's ``pad``), their methods' loops in one
    ``RowStack``. Each row's driver and cache keep views of their parts, and each row's fed token is a
    view of the step's ``tokens``. Made when the rows change; ``leave`` hands every row back its own.

    Parameters:
        model: the causal LM.
        sequences: the engine's sequences, each ``steady_ready``.
        stack: their methods' ``stack``.
        mode: one of ``MODES``.
    """

    #: The paths: no row observes the step, some rows do, every row does.
    NONE, SOME, EVERY = 0, 1, 2

    def __init__(self, model: Any, sequences: list[Any], stack: RowStack, mode: str) -> None:
        super().__init__(mode)
        self.model, self.sequences, self.stack = model, list(sequences), stack
        self.steps = 0
        drivers = [sequence.state.driver for sequence in self.sequences]
        shapes = [driver.steady_shape() for driver in drivers]
        layers, rows, _ = shapes[0]
        device = drivers[0].info.device
        size = max(shape[-1] for shape in shapes)
        self.table = torch.full((layers, len(drivers), rows, size), stack.pad, dtype=torch.long, device=device)
        for row, (driver, shape) in enumerate(zip(drivers, shapes, strict=True)):
            driver.enter_steady(self.table[:, row, :, : shape[-1]])
        self.slots = kv_cache.RowSlots([sequence.cache for sequence in self.sequences])
        self.cache = kv_cache.batch_cache(model, [sequence.cache for sequence in self.sequences], self.slots)
        last = torch.tensor([shape[-1] - 1 for shape in shapes], device=device)
        self._newest = last.view(1, -1, 1, 1).expand(layers, -1, rows, 1)
        self.tokens = torch.cat([sequence.token_t for sequence in self.sequences])
        for row, sequence in enumerate(self.sequences):
            sequence.token_t = self.tokens[row : row + 1]
        self.positions = torch.tensor([[driver.seen] for driver in drivers], device=device)
        # One state per path, made once: a compiled step guards on what it reads.
        self.states: dict[int, BatchState] = {}

    def _step(self, path: int) -> None:
        self.table.scatter_(3, self._newest, self.positions.view(1, -1, 1, 1).expand_as(self._newest))
        output = self.model(
            input_ids=self.tokens, position_ids=self.positions, cache=self.cache, use_cache=True, logits_to_keep=1
        )
        slots = self.stack.evict_one(self.table, self.positions + 1, path != self.NONE, path == self.SOME)
        self.slots.refill(slots)
        self.table.scatter_(3, slots, self.positions.view(1, -1, 1, 1).expand_as(slots))
        self.tokens.copy_(output.logits[:, -1].argmax(dim=-1, keepdim=True))
        self.positions.add_(1)

    def step(self, observing: list[bool]) -> None:
        """One step of every row, row r's method observing it as ``observing[r]`` says (each row's host counters
        already advanced, ``_Sequence.count_steady``)."""
        self.steps += 1
        path = self.EVERY if all(observing) else self.SOME if any(observing) else self.NONE
        if path not in self.states:
            # Whether the methods read the weights follows from whether they observe (as in ``SteadyLoop``'s paths).
            attention = any(sequence.state.driver.attention for sequence in self.sequences)
            fused = self.sequences[0].state.fused
            steady = RowsStep(
                self.stack, self.table, self.slots.free, path != self.NONE, attention, path == self.SOME, fused
            )  # fmt: skip
            self.states[path] = BatchState([sequence.state for sequence in self.sequences], steady=steady)
        with EVICTING.active(self.states[path]):
            self.run(path)

    def leave(self) -> None:
        """Each row's method state, positions, cache counters and fed token back as its own."""
        self.stack.unstack()
        self.slots.leave(self.steps)
        for sequence in self.sequences:
            sequence.state.driver.leave_steady()
            sequence.token_t = sequence.token_t.clone()


def host_token(token: Tensor) -> int:
    """The fed token's id on the host (a wait on a GPU: the loop reads it a few steps behind)."""
    return int(token)


class TokenReader:
    """The host's copies of the steady steps' tokens, read ``lag`` steps behind the device.

    Each token is copied without waiting into a host buffer (pinned on a GPU) with an event after it;
    the host reads it once ``lag`` later steps have been launched, when the device is long done with
    it. The loop thus decides its stops (end-of-turn, stop strings, ``max_new_tokens``) a few steps
    late; the steps run past a stop are discarded (``Engine.generate``). With ``lag`` 0 every token is
    read at once.
    """

    def __init__(self, device: torch.device, lag: int) -> None:
        self.lag = lag
        self.pinned = device.type == "cuda"
        self.pending: deque[tuple[Tensor, Any]] = deque()

    def __len__(self) -> int:
        return len(self.pending)

    def push(self, token: Tensor) -> list[int]:
        """Start copying ``token`` to the host; the tokens now ``lag`` steps old, in order."""
        return self.enqueue(*self.start_copy(token.view(1)))

    def start_copy(self, tokens: Tensor) -> tuple[Tensor, Any]:
        """Start copying the 1-D ``tokens`` (a batch's rows: one copy for all) to the host: the host buffer and
        the event that marks the copy done (None off CUDA)."""
        host = torch.empty(tokens.shape, dtype=torch.long, pin_memory=self.pinned)
        host.copy_(tokens, non_blocking=True)
        event = None
        if self.pinned:
            event = torch.cuda.Event()
            event.record()
        return host, event

    def enqueue(self, host: Tensor, event: Any, row: int = 0) -> list[int]:
        """Queue row ``row`` of a copy ``start_copy`` began; the tokens now ``lag`` steps old, in order."""
        self.pending.append((host[row : row + 1], event))
        return self._read(self.lag)

    def drain(self) -> list[int]:
        """Every token still on its way, in order."""
        return self._read(0)

    def _read(self, keep: int) -> list[int]:
        out = []
        while len(self.pending) > keep:
            host, event = self.pending.popleft()
            if event is not None:
                event.synchronize()
            # A plain read of host memory: nothing the device is asked for.
            out.append(int(host.numpy()[0]))
        return out
