"""Which cached entries survive: budget, protected sinks and recent window, granularity."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from methods.options import is_int, is_number

GRANULARITIES = ("token", "layer", "head")


def check_rho(rho: object) -> None:
    """Refuse a compression ratio that is not a number in [0, 1)."""
    meaning = "rho is the fraction of the prompt cache evicted"
    if not is_number(rho):
        raise ValueError(f"rho={rho!r} is not a number — {meaning}: use a value in [0, 1), e.g. rho=0.9")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho={rho!r} is outside [0, 1) — {meaning}: use e.g. rho=0.9 (rho=0 keeps everything)")


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
        reserve_fraction: protect a static reserve of ``floor(reserve_fraction * B)`` prompt
            positions spread evenly over the prompt (InertiaKV App. B's auxiliary variant: coarse
            positional coverage that the scores cannot evict).
        granularity: ``token`` (one keep set shared by all layers and heads), ``layer`` (one
            per layer, shared by its heads) or ``head`` (one per layer and KV head).
    """

    rho: float = 0.0
    budget_tokens: int | None = None
    sinks: int = 0
    window: int = 0
    recent_fraction: float = 0.0
    granularity: str = "token"
    reserve_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_rho(self.rho)
        where = "method.selection"
        if self.budget_tokens is not None and (not is_int(self.budget_tokens) or self.budget_tokens < 1):
            raise ValueError(
                f"{where}.budget_tokens={self.budget_tokens!r} is not a positive number of cache entries"
                " — use e.g. budget_tokens=256, or null to follow rho"
            )
        for option in ("sinks", "window"):
            value = getattr(self, option)
            if not is_int(value) or value < 0:
                raise ValueError(f"{where}.{option}={value!r} is not an integer >= 0 — use e.g. 4")
        for option, example in (("recent_fraction", "0.5 (half the budget)"), ("reserve_fraction", "0.1")):
            value = getattr(self, option)
            if not (is_number(value) and 0.0 <= value < 1.0):
                raise ValueError(f"{where}.{option}={value!r} is outside [0, 1) — use e.g. {where}.{option}={example}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"{where}.granularity={self.granularity!r} is not a granularity — use one of {', '.join(GRANULARITIES)}"
            )

    def recent(self, budget: int) -> int:
        """Size of the protected recent window under ``budget``."""
        return max(self.window, exact_floor(self.recent_fraction * budget))

    def reserve(self, budget: int, prompt_len: int) -> Tensor:
        """The static reserve under ``budget``: ``floor(reserve_fraction * B)`` prompt positions, evenly spaced."""
        count = min(exact_floor(self.reserve_fraction * budget), prompt_len)
        return torch.arange(count) * prompt_len // max(count, 1)

    def reserved(self, budget: int, prompt_len: int, capacity: int, device: torch.device) -> Tensor | None:
        """The static reserve as a mask over positions ``0 .. capacity - 1`` on ``device`` (None without one):
        made once per sequence, so a step tests its entries by indexing, not by sorting (``isin``)."""
        if self.reserve_fraction == 0:
            return None
        mask = torch.zeros(capacity, dtype=torch.bool)
        mask[self.reserve(budget, prompt_len)] = True
        return mask.to(device)

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
        reserve = exact_floor(self.reserve_fraction * budget)
        protected = self.sinks + self.recent(budget) + reserve
        if budget < max(protected, 1):
            kept = f"sinks+window={self.sinks}+{self.recent(budget)}" + (f"+reserve {reserve}" if reserve else "")
            raise ValueError(
                f"budget B={budget} ({origin}) is smaller than {kept}={protected} — {fix},"
                " or shrink method.selection.sinks/window" + ("/reserve_fraction" if reserve else "")
            )
        return budget

    def select(
        self, priority: Tensor, positions: Tensor, seen: int, budget: int, reserved: Tensor | None = None
    ) -> Tensor:
        """Indices (sorted, per row) of the ``budget`` entries to keep.

        Parameters:
            priority: ``(rows, T)`` higher is kept first.
            positions: ``(rows, T)`` absolute positions of the entries.
            seen: tokens seen so far; positions ``>= seen - recent`` are protected.
            reserved: the static reserve's mask (``reserved``; needed when ``reserve_fraction > 0``).
        """
        ranked = priority.masked_fill(self.protected(positions, seen, budget, reserved), torch.inf)
        return ranked.topk(budget, dim=-1).indices.sort(dim=-1).values

    def evict_one(
        self, priority: Tensor, positions: Tensor, seen: Tensor | int, budget: int, reserved: Tensor | None
    ) -> Tensor:
        """Of ``budget + 1`` entries per row, the one to give up: the lowest priority not protected, ``(..., 1)``.

        One ``argmin`` rather than ``select``'s sort of the ``budget`` kept; among equal priorities the first
        slot goes (``select`` gives no order among ties).
        """
        protected = self.protected(positions, seen, budget, reserved) if self.protects(budget) else None
        return evict_unprotected(priority, protected)

    def protects(self, budget: int) -> bool:
        """Whether ``protected`` can hold any entry under ``budget`` (else a step need not compute it)."""
        return self.sinks > 0 or self.recent(budget) > 0 or self.reserve_fraction > 0

    def protected(self, positions: Tensor, seen: Tensor | int, budget: int, reserved: Tensor | None = None) -> Tensor:
        """Which entries ``select`` always keeps (sinks, recent window, static reserve), as a mask of ``positions``."""
        return self.protected_from(positions, seen - self.recent(budget), reserved)

    def protected_from(self, positions: Tensor, recent_from: Tensor | int, reserved: Tensor | None = None) -> Tensor:
        """``protected`` with the recent window given as its first position; several sequences' rows at once (a
        batch's stacked rows) give one per row, and ``reserved`` as a mask per row, ``(..., capacity)``."""
        protected = (positions < self.sinks) | (positions >= recent_from)
        if self.reserve_fraction > 0:
            if reserved is None:
                raise ValueError(
                    f"method.selection.reserve_fraction={self.reserve_fraction} needs the decode-time scored"
                    " selection, which knows the prompt length — use it with a scored method, or set it to 0"
                )
            if reserved.dim() == 1:
                protected |= reserved[positions]
            else:
                protected |= reserved.expand(*positions.shape[:-1], -1).gather(-1, positions)
        return protected


def evict_unprotected(priority: Tensor, protected: Tensor | None) -> Tensor:
    """Per row, the slot of the lowest priority not ``protected`` (None: none is) ``(..., 1)``; among equal
    priorities the first."""
    if protected is not None:
        priority = priority.masked_fill(protected, torch.inf)
    return priority.argmin(dim=-1, keepdim=True)
