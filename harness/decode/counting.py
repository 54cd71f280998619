"""Kernels and host syncs of a piece of work, counted on any device (a CPU included).

On a GPU a decode step is a stream of small kernels, and their number and the host syncs
between them set its pace; neither can be timed here, so they are counted. A dispatch mode
sees every aten operation the work runs:

- a **kernel** is an operation that computes or writes memory; views (``view``, ``slice``,
  ``expand``, ...) only describe memory and launch nothing;
- a **host sync** is an operation whose result the host must wait for on a GPU: reading a value
  (``int(t)``, ``t.item()``, ``t.tolist()``, ``bool(t)``), an output whose size depends on the
  data (``nonzero``, ``masked_select``, ``unique``, ``isin``, which sorts through ``unique``),
  a copy from the device to the host, and waiting on the device or on an event.

``Tensor.tolist``, the CUDA waits, and (under ``torch.inference_mode``, as the engine decodes) the
dtype and device conversions (``Tensor.to``, ``.float()``, ...) do not reach a dispatch mode, so the
counter wraps them while it is active: a conversion that makes a new tensor is one ``_to_copy`` kernel,
and a host sync when it brings a device tensor to the host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Operations whose result the host waits for (by their overload packet's name).
SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "nonzero_static", "masked_select",
    "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive", "isin",
    "repeat_interleave", "allclose", "_assert_async",
})  # fmt: skip


#: Tensor methods that convert dtype or device without reaching a dispatch mode under inference mode.
CONVERSIONS = ("to", "float", "double", "half", "bfloat16", "cpu", "cuda", "type_as")


def _device_to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy of a device tensor into host memory (``.cpu()``, ``.to("cpu")``, ``copy_`` into a CPU tensor)."""
    name = func.overloadpacket.__name__
    if name == "_to_copy":
        source, target = args[0], kwargs.get("device")
        return source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    if name == "copy_":
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


@dataclass
class Counts:
    """What one piece of work ran: kernels and host syncs, by operation."""

    kernels: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)

    @property
    def kernel_count(self) -> int:
        return sum(self.kernels.values())

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())


class _Counter(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNC_OPS or _device_to_host(func, args, kwargs):
            self.counts.syncs[name] += 1
        if not func.is_view:
            self.counts.kernels[name] += 1
        return func(*args, **kwargs)


@contextmanager
def counting() -> Iterator[Counts]:
    """Count the kernels and host syncs of everything run inside (``with counting() as counts: ...``)."""
    counts = Counts()
    tolist = torch.Tensor.tolist
    waits = {}

    def counted_tolist(tensor: torch.Tensor) -> Any:
        counts.syncs["tolist"] += 1
        return tolist(tensor)

    def waiting(name: str, wait: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            counts.syncs[name] += 1
            return wait(*args, **kwargs)

        return wrapped

    def converting(name: str, convert: Any) -> Any:
        def wrapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            seen = sum(counts.kernels.values())
            out = convert(tensor, *args, **kwargs)
            # Counted here only where the dispatch mode saw nothing of it.
            if isinstance(out, torch.Tensor) and out is not tensor and sum(counts.kernels.values()) == seen:
                counts.kernels["_to_copy"] += 1
                if tensor.device.type != "cpu" and out.device.type == "cpu":
                    counts.syncs["_to_copy"] += 1
            return out

        return wrapped

    conversions = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}
    for name, convert in conversions.items():
        setattr(torch.Tensor, name, converting(name, convert))
    torch.Tensor.tolist = counted_tolist
    if torch.cuda.is_available():
        waits = {"synchronize": torch.cuda.synchronize, "elapsed_time": torch.cuda.Event.elapsed_time}
        torch.cuda.synchronize = waiting("synchronize", waits["synchronize"])
        torch.cuda.Event.elapsed_time = waiting("elapsed_time", waits["elapsed_time"])
    try:
        with _Counter(counts):
            yield counts
    finally:
        torch.Tensor.tolist = tolist
        for name, convert in conversions.items():
            setattr(torch.Tensor, name, convert)
        if waits:
            torch.cuda.synchronize = waits["synchronize"]
            torch.cuda.Event.elapsed_time = waits["elapsed_time"]
