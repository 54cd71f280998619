"""What a scorer is: a per-step importance signal for every cached entry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

from methods.base import LayerView, SequenceInfo

#: The flags every scorer declares, and when each is True. A default would be a silent trap: a
#: scorer that reads the cache's order and forgot to opt out would go wrong after a slot refill.
FLAGS = {
    "needs_attention": "it reads view.weights, the attention of the current query",
    "order_free": "its scores do not depend on where an entry sits in the cache",
}


class Scorer(ABC):
    """Maps one layer's view to a score per KV head and entry, ``(kv_heads, T)``; higher = keep.

    A subclass declares both class attributes below (``FLAGS``), or inherits them from a base
    between it and ``Scorer`` that does; constructing one that does not is refused.
    """

    #: Whether the score reads ``view.weights`` (the engine then exposes the attention).
    needs_attention: ClassVar[bool]
    #: Whether an entry's score is the same in any cache order (``EvictionMethod.order_free``).
    order_free: ClassVar[bool]
    #: Whether ``score`` also serves a batch's stacked rows (``methods.base.RowStack``): a view whose tensors lead
    #: with a row dimension N, scored ``(N, kv_heads, T)``. False (safe) leaves each row to its own method.
    rows: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        declarers = cls.__mro__[: cls.__mro__.index(Scorer)]
        for flag, meaning in FLAGS.items():
            if not any(flag in vars(base) for base in declarers):
                raise ValueError(
                    f"scorer {cls.__name__} does not declare {flag} — set {flag} = True if {meaning}, else False"
                )
        return super().__new__(cls)

    def begin(self, info: SequenceInfo) -> None:
        """Reset per-sequence state."""

    @abstractmethod
    def score(self, view: LayerView) -> Tensor:
        """Scores ``(kv_heads, T)`` for the entries of ``view``."""

    def pooled(self, view: LayerView) -> Tensor:
        """The mean of ``score`` over the KV heads, ``(1, T)`` (stacked rows: ``(N, 1, T)``). A scorer may compute it
        in one pass, which rounds otherwise, so a method calls it only from ``SequenceInfo.numerics`` 3."""
        return self.score(view).mean(dim=-2, keepdim=True)

    def layer_mean(self, views: Sequence[LayerView], weights: Tensor) -> Tensor:
        """The mean over a step's layers of ``weights[l] * pooled(views[l])``, ``(1, T)`` (stacked rows: ``(N, 1, T)``),
        the views over the same entries. A scorer may compute it in one pass, which rounds otherwise, so a method
        calls it only under ``SequenceInfo.numerics`` 4."""
        return torch.stack([self.pooled(view) for view in views], dim=-1).mul(weights).mean(dim=-1)


def group_mean(view: LayerView, heads: tuple[int, ...] = (-2,)) -> Tensor:
    """Attention of the current query, mean-pooled over each KV head's query group (``heads`` (-3, -2): over every
    query head at once, ``(T,)``)."""
    if view.weights is None:
        raise ValueError("this scorer needs attention weights, but the view carries none")
    # The group is the second-last dimension: a batch's stacked rows lead with one more.
    return view.weights.float().mean(dim=heads)


class EntryNorms:
    """The norm of every cached key (or value), measured once per entry and kept by absolute position.

    A norm never changes once its entry is cached, so measuring the whole cache in fp32 at every
    step is wasted work. Entries arrive at the end of a layer's cache, so those not measured yet
    are among its last ``view.seen - measured`` entries, which needs no read of a device tensor.
    Before ``begin``, and on views without ``seen`` or ragged ones, the whole view is measured.
    """

    def __init__(self) -> None:
        self._norms: Tensor | None = None
        self._measured: list[int] = []

    def begin(self, info: SequenceInfo) -> None:
        capacity = info.prefill_len + info.max_new_tokens + 1
        self._norms = torch.zeros(info.num_layers, info.num_kv_heads, capacity, device=info.device)
        self._measured = [0] * info.num_layers

    def __call__(self, view: LayerView, entries: Tensor) -> Tensor:
        """``(kv_heads, T)`` fp32 norms of ``entries`` ``(kv_heads, T, D)`` (its keys or values), on their device."""
        if self._norms is None or view.seen is None or isinstance(view.positions, tuple):
            return entries.float().norm(dim=-1)
        norms, positions = self._norms[view.layer], view.positions.to(self._norms.device)
        fresh = min(entries.shape[1], view.seen - self._measured[view.layer])
        if fresh > 0:
            norms.scatter_(1, positions[:, -fresh:], entries[:, -fresh:].float().norm(dim=-1).to(norms.device))
            self._measured[view.layer] = view.seen
        return norms.gather(1, positions).to(entries.device)


@dataclass
class NormScorer(Scorer):
    """A scorer built on the norms of cached keys or values, measured once per entry (``EntryNorms``)."""

    order_free: ClassVar[bool] = False  # EntryNorms finds the entries it has not measured at the end of the cache
    norms: EntryNorms = field(default_factory=EntryNorms, init=False, repr=False, compare=False)

    def begin(self, info: SequenceInfo) -> None:
        self.norms.begin(info)
