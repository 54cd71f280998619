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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from harness.decode import kv_cache

MODES = ("eager", "compiled", "graph")


class SteadyLoop:
    """The steady steps of one sequence: its slots in one buffer, its positions table, a graph per path.

    Parameters:
        model: the causal LM.
        sequence: the engine's sequence (its cache, driver, fed token and position counter).
        mode: one of ``MODES``.
    """

    def __init__(self, model: Any, sequence: Any, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"steady mode {mode!r} is not one of {MODES}")
        self.model, self.sequence, self.mode = model, sequence, mode
        self.slots = kv_cache.ModelSlots(sequence.cache)
        self.table = sequence.state.driver.enter_steady()
        self.paths: dict[bool, Callable[[], None]] = {}

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
        driver.refill_table(slots)
        sequence.token_t.copy_(output.logits[0, -1].argmax().view(1, 1))
        position.add_(1)

    def run(self, observing: bool) -> None:
        """One steady step; ``observing`` picks the path (whether the method observes at this step)."""
        path = self.paths.get(observing)
        if path is not None:
            path()
            return
        if self.mode == "compiled":
            # The CPU's proxy of capture: one graph, no break; the tests forbid recompiling it.
            compiled = torch.compile(self._step, fullgraph=True, dynamic=False, backend="eager")
            self.paths[observing] = lambda: compiled(observing)
            self.paths[observing]()
            return
        self._step(observing)
        if self.mode == "graph":
            self.paths[observing] = self._capture(observing)
        else:
            self.paths[observing] = lambda: self._step(observing)

    def _capture(self, observing: bool) -> Callable[[], None]:
        """The path as a CUDA graph: the step just run as it is was its warm-up; capturing runs nothing."""
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            self._step(observing)
        torch.cuda.current_stream().wait_stream(stream)
        return graph.replay

    def leave(self) -> None:
        """The sequence's positions back as per-layer tensors of the budget's entries."""
        self.sequence.state.driver.leave_steady()


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
