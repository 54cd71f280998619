"""The full cache: the reference every method is compared against."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from methods.base import EvictionMethod, KeepPlan


@dataclass
class FullCache(EvictionMethod):
    """Keeps every entry; decoding runs on the model's own attention kernel."""

    name: str = "full"

    def budget(self) -> int | None:
        return None

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        return None
