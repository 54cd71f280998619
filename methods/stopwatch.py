"""Time spent on a device without stalling it: CUDA events there, the wall clock elsewhere.

CUDA kernels run asynchronously, so a wall clock read around a launch measures the launch. On CUDA
each interval is a pair of events recorded in the stream; they are read only when ``seconds`` is
asked for (once a sequence ends), which is the one point that waits for the device. A forward timed
this way never synchronises with the host.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Stopwatch:
    """Accumulated time of the intervals run under ``timing()``, on ``device``'s clock."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def timing(self) -> Iterator[None]:
        if not self.cuda:
            start = time.perf_counter()
            yield
            self._seconds += time.perf_counter() - start
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._events.append((begin, end))

    @property
    def seconds(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(begin.elapsed_time(end) for begin, end in self._events) / 1000
            self._events.clear()
        return self._seconds

    def reset(self) -> None:
        self._seconds = 0.0
        self._events.clear()


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (every visible CUDA device: a sharded model spans several)."""
    if device.type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


class Unclocked:
    """A ``Stopwatch`` that times nothing: a step that must not wait on the host (a captured graph, a
    compiled step) runs without a clock inside, and its share is not measured (``seconds`` is None)."""

    seconds = None

    def timing(self) -> contextlib.AbstractContextManager[None]:
        # A plain null context: a compiler traces through it, where a generator-based one can break the graph.
        return contextlib.nullcontext()

    def reset(self) -> None:
        """Nothing to forget."""
