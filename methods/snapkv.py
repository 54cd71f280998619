"""SnapKV (Li et al. 2024, arXiv:2404.14469): prefill-time selection from an observation window."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.options import is_int
from methods.prompt_attention import prompt_attention_votes
from methods.selection import Selection

POOLINGS = ("max", "avg")


@dataclass
class SnapKV(EvictionMethod):
    """Keep, per KV head, the prompt entries the last prompt queries attend to most.

    The attention of the observation window (the last ``selection.window`` prompt queries) on
    the earlier entries is summed over those queries, averaged over each KV head's query
    group and smoothed along positions by 1-D pooling; the top entries plus the window itself
    fill the budget. Selection happens once after the prefill; the cache then grows.

    Parameters:
        selection: budget (granularity ``head``); ``window`` is the observation window (paper: 32).
        kernel_size: pooling kernel along positions (paper: 7).
        pooling: ``max`` (paper) or ``avg``.
        pool_over_window: False (SnapKV's code, kvpress; ``conf/method/snapkv.yaml``): pooling
            smooths only the entries before the window, padded at the window's edge; True (the
            dataclass default, so that records made before the parameter existed keep their run
            id): it also reaches into the window's own columns, which moves the keep set near
            that edge.
        name: label for records and tables.
    """

    selection: Selection
    kernel_size: int = 7
    pooling: str = "max"
    pool_over_window: bool = True
    name: str = "snapkv"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"method.pooling={self.pooling!r} is not a pooling — use one of {', '.join(POOLINGS)}")
        size = self.kernel_size
        if not is_int(size) or size < 1 or size % 2 == 0:
            raise ValueError(
                f"method.kernel_size={size!r} must be a positive odd integer — use e.g. method.kernel_size=7"
            )
        if self.selection.granularity != "head":
            raise ValueError(
                f"method.selection.granularity={self.selection.granularity!r} does not suit SnapKV, which selects "
                "per KV head — use method.selection.granularity=head"
            )
        if self.selection.window < 1:
            raise ValueError(
                f"method.selection.window={self.selection.window!r} leaves SnapKV no observation window "
                "— use e.g. method.selection.window=32"
            )

    def check(self, info: SequenceInfo) -> int | None:
        return self.selection.budget_for(info.prefill_len)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self._scores: dict[int, Tensor] = {}

    def budget(self) -> int | None:
        return self._budget

    def appends_only(self) -> bool:
        return True  # the cut is the prefill's

    @property
    def wants_prefill_queries(self) -> int:
        return self.selection.window if self._budget is not None else 0

    def observe_prefill(self, view: LayerView) -> None:
        votes = prompt_attention_votes(view.to(self.info.device))
        pool = torch.nn.functional.max_pool1d if self.pooling == "max" else torch.nn.functional.avg_pool1d
        pad = self.kernel_size // 2
        # The window's own entries are kept whatever they score; only what precedes them is ranked.
        prefix = votes.shape[-1] if self.pool_over_window else max(votes.shape[-1] - self.selection.window, 0)
        if prefix:
            pooled = pool(votes[:, :prefix].unsqueeze(1), self.kernel_size, stride=1, padding=pad).squeeze(1)
            votes = torch.cat([pooled, votes[:, prefix:]], dim=-1)
        self._scores[view.layer] = votes

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if self._budget is None or step != 0 or positions[0].shape[-1] <= self._budget:
            return None
        seen = self.info.prefill_len
        return [
            self.selection.select(self._scores.pop(layer), layer_positions, seen, self._budget)
            for layer, layer_positions in enumerate(positions)
        ]
