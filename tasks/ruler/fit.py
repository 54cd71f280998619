"""Fitting a synthesised RULER prompt to a target length, shared by every subtask.

RULER sizes each prompt with a haystack of ``num`` units (noise lines, essay words, distinct
words, documents, ...): it estimates tokens per unit from one small probe, bisects up to
three times the size that estimate predicts (fwe: grows it linearly instead), then builds
every example at that size and drops a fixed step of units from one that overflows. Here the
subtask only says how to synthesise a prompt of ``num`` units; the search and the fitting live
once, below, in two forms (``RulerTask.sizing``):

- ``tight`` (the default): an overflowing example drops an estimate of its overflow, and the
  examples of every subtask but niah are then refitted one by one to the largest size that fits,
  so prompts end within a few tokens of the length;
- ``ruler``: RULER's own (NVIDIA/RULER 533f013): one size per (subtask, length), a fixed step
  dropped on overflow, fwe's linear search. Prompts end up to a step short of the length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Encoder(Protocol):
    """Prompt -> prefill ids.

    ``shots`` are earlier (user, assistant) turns for the subtasks whose protocol shows the
    model solved examples first (cwe); the answer prefix opens the model's reply.
    """

    def __call__(self, prompt: str, answer_prefix: str, shots: Sequence[tuple[str, str]] = ()) -> list[int]: ...


@dataclass
class Sample:
    """One synthesised example before tokenisation.

    Parameters:
        prompt: the task template filled in (the user turn).
        answer_prefix: RULER's answer prefix, the start of the model's reply.
        answers: the references the metric looks for.
        shots: solved (prompt, reply) turns that precede the prompt.
        meta: facts worth keeping in the record (depths, document counts, ...).
    """

    prompt: str
    answer_prefix: str
    answers: list[str]
    shots: tuple[tuple[str, str], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


def encode_sample(encode: Encoder, sample: Sample) -> list[int]:
    return encode(sample.prompt, sample.answer_prefix, sample.shots)


@dataclass(frozen=True)
class HaystackSize:
    """Result of the haystack search for one (subtask, length)."""

    num_haystack: int
    tokens_per_unit: float


def search_size(cost: Callable[[int], int], budget: int, step: int, minimum: int = 1) -> HaystackSize | None:
    """Largest ``num >= minimum`` whose prompt costs at most ``budget`` tokens; None if none does.

    ``cost(num)`` synthesises and encodes a prompt of ``num`` units. RULER's procedure: probe
    one ``step`` of haystack, bisect up to three times the size that rate predicts. When a
    fixed part of the prompt (templates, few-shot turns) dominates the probe, that bound is
    too low; it is then doubled until a probe overflows.
    """
    small = cost(step)
    top = max(int(budget / (small / step) * 3), 2 * step)
    lower, upper, best, best_cost = minimum, top, 0, 0
    while True:
        while lower <= upper:
            mid = (lower + upper) // 2
            tokens = cost(mid)
            if tokens <= budget:
                best, best_cost, lower = mid, tokens, mid + 1
            else:
                upper = mid - 1
        if best != top:
            break
        lower, upper, top = top + 1, 2 * top, 2 * top
    if best == 0:
        return None
    # The slope between two probes leaves out the fixed template cost.
    per_unit = abs(best_cost - small) / abs(best - step) if best != step else small / step
    return HaystackSize(best, max(per_unit, 1e-6))


def linear_size(cost: Callable[[int], int], budget: int, start: int, step: int) -> HaystackSize | None:
    """RULER's fwe search: from ``start`` units, ``step`` more while the prompt stays under ``budget``, then one back.

    The result sits up to one ``step`` below the largest fitting size (``search_size`` finds that
    one); None if it is not positive.
    """
    num, tokens = start, cost(start)
    while tokens < budget:
        num += step
        tokens = cost(num)
    num -= step
    return HaystackSize(num, tokens / (num + step)) if num > 0 else None


def fit_size(
    build: Callable[[int, random.Random], Sample],
    encode: Encoder,
    budget: int,
    size: HaystackSize,
    seed_key: str,
    minimum: int = 1,
    refine: bool = True,
    drop: int | None = None,
) -> tuple[Sample, list[int]] | None:
    """Synthesise one example at the searched size, shrinking it while it overflows ``budget``.

    Each attempt reseeds from ``seed_key``, so resizing keeps the example's needles and
    answers. The shrink step is an estimate of the overflow in units, or ``drop`` units (RULER's
    own step, which it drops from an overflowing example). With ``refine`` (and no ``drop``) the
    example is then fitted exactly: grown while it fits, and bisected between the largest
    fitting and smallest overflowing size, because examples whose tokens per unit vary (fwe's
    random words) would otherwise land several percent short. None if even ``minimum``
    units overflow.
    """

    def attempt(num: int) -> tuple[Sample, list[int]]:
        sample = build(num, random.Random(seed_key))
        return sample, encode_sample(encode, sample)

    num, too_many = size.num_haystack, None
    while True:
        fitted = attempt(num)
        overflow = len(fitted[1]) - budget
        if overflow <= 0:
            break
        if num <= minimum:
            return None
        too_many = num
        num = max(minimum, num - (drop or math.ceil(overflow / size.tokens_per_unit)))
    if not refine or drop is not None:
        return fitted
    if too_many is None:
        gap = max(1, int(-overflow / size.tokens_per_unit))
        while too_many is None:
            candidate = attempt(num + gap)
            if len(candidate[1]) <= budget:
                fitted, num, gap = candidate, num + gap, 2 * gap
            else:
                too_many = num + gap
    lower, upper = num + 1, too_many - 1
    while lower <= upper:
        mid = (lower + upper) // 2
        candidate = attempt(mid)
        if len(candidate[1]) <= budget:
            fitted, lower = candidate, mid + 1
        else:
            upper = mid - 1
    return fitted
