"""Which cached entries survive: budget, protected sinks and recent window, granularity."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

GRANULARITIES = ("token", "layer", "head")


def check_rho(rho: object) -> None:
    """Refuse a compression ratio that is not a number in [0, 1)."""
    meaning = "rho is the fraction of the prompt cache evicted"
    if isinstance(rho, bool) or not isinstance(rho, int | float):
        raise ValueError(f"rho={rho!r} is not a number — {meaning}: use a value in [0, 1), e.g. rho=0.9")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho={rho!r} is outside [0, 1) — {meaning}: use e.g. rho=0.9 (rho=0 keeps everything)")


def _is_int(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def exact_floor(value: float) -> int:
    """Floor of a product of decimal fractions: (1 - 0.9) * 1000 must give 100, not 99."""
    return math.floor(value + 1e-9)


@dataclass
class Selection:
    """Budget and protection rules shared by every scored method.

    The budget is ``B = floor((1 - rho) * L0)`` entries per layer and KV head (InertiaKV's
    definition, L0 the prompt length), or ``budget_tokens`` when given. ``rho = 0`` without
    ``budget_tokens`` means no eviction at all.

    Parameters:
        rho: compression ratio in [0, 1).
        budget_tokens: fixed budget overriding ``rho``.
        sinks: leading positions always kept (StreamingLLM's attention sinks).
        window: most recent positions always kept.
        recent_fraction: alternatively protect this fraction of B as recent window
            (H2O splits its budget half heavy hitters, half recent); the larger of the two wins.
        granularity: ``token`` (one keep set shared by all layers and heads), ``layer`` (one
            per layer, shared by its heads) or ``head`` (one per layer and KV head).
    """

    rho: float = 0.0
    budget_tokens: int | None = None
    sinks: int = 0
    window: int = 0
    recent_fraction: float = 0.0
    granularity: str = "token"

    def __post_init__(self) -> None:
        check_rho(self.rho)
        where = "method.selection"
        if self.budget_tokens is not None and not _is_int(self.budget_tokens, 1):
            raise ValueError(
                f"{where}.budget_tokens={self.budget_tokens!r} is not a positive number of cache entries"
                " — use e.g. budget_tokens=256, or null to follow rho"
            )
        for option in ("sinks", "window"):
            if not _is_int(getattr(self, option), 0):
                raise ValueError(f"{where}.{option}={getattr(self, option)!r} is not an integer >= 0 — use e.g. 4")
        if isinstance(self.recent_fraction, bool) or not (
            isinstance(self.recent_fraction, int | float) and 0.0 <= self.recent_fraction < 1.0
        ):
            raise ValueError(
                f"{where}.recent_fraction={self.recent_fraction!r} is outside [0, 1) — use e.g. 0.5 (half the budget)"
            )
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"{where}.granularity={self.granularity!r} is not a granularity — use one of {', '.join(GRANULARITIES)}"
            )

    def recent(self, budget: int) -> int:
        """Size of the protected recent window under ``budget``."""
        return max(self.window, exact_floor(self.recent_fraction * budget))

    def budget_for(self, prefill_len: int) -> int | None:
        """The budget for a prompt of ``prefill_len`` tokens; None when nothing is evicted."""
        if self.budget_tokens is not None:
            budget = self.budget_tokens
            origin = f"method.selection.budget_tokens={budget}"
            fix = "raise method.selection.budget_tokens"
        elif self.rho == 0.0:
            return None
        else:
            budget = exact_floor((1.0 - self.rho) * prefill_len)
            origin = f"rho={self.rho} of L0={prefill_len} prompt tokens"
            fix = "lower rho, or use longer prompts"
        protected = self.sinks + self.recent(budget)
        if budget < max(protected, 1):
            raise ValueError(
                f"budget B={budget} ({origin}) is smaller than sinks+window={self.sinks}+{self.recent(budget)}"
                f"={protected} — {fix}, or shrink method.selection.sinks/window"
            )
        return budget

    def select(self, priority: Tensor, positions: Tensor, seen: int, budget: int) -> Tensor:
        """Indices (sorted, per row) of the ``budget`` entries to keep.

        Parameters:
            priority: ``(rows, T)`` higher is kept first.
            positions: ``(rows, T)`` absolute positions of the entries.
            seen: tokens seen so far; positions ``>= seen - recent`` are protected.
        """
        protected = (positions < self.sinks) | (positions >= seen - self.recent(budget))
        ranked = priority.masked_fill(protected, torch.inf)
        return ranked.topk(budget, dim=-1).indices.sort(dim=-1).values
