"""What every task provides to the harness.

A task knows nothing of eviction methods: it synthesises or loads examples, turns one into
prompt token ids following its benchmark's official protocol, and scores a prediction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """One evaluation item.

    Parameters:
        example_id: stable identity across runs and resumptions (e.g. ``niah_single_1/2048/0003``).
        subtask: the benchmark's sub-dataset name, used to group scores.
        input_ids: prompt token ids, ready for prefill (chat template and answer prefix included).
        answers: gold references the scorer compares against.
        max_new_tokens: generation length the official protocol allows.
        meta: anything else worth keeping in the record (length, depth, ...).
        forced_ids: a continuation to teacher-force instead of generating (perplexity tasks);
            the task then scores log-probabilities through ``score_logprobs``.
        stop_token_ids: token ids that end generation for this example, beyond the model's
            end-of-turn (LongBench's samsum stops at the newline token).
        min_new_tokens: stop tokens are suppressed until this many tokens exist (the official
            ``min_length`` of protocols that add stop tokens).
    """

    example_id: str
    subtask: str
    input_ids: list[int]
    answers: list[str]
    max_new_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)
    forced_ids: list[int] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    min_new_tokens: int = 0


class Task(ABC):
    """A benchmark suite. Subclasses are dataclasses built from ``conf/task/*.yaml``."""

    name: str

    @abstractmethod
    def examples(self, tokenizer: Any) -> list[Example]:
        """Build the examples, tokenised with the evaluated model's tokenizer."""

    @abstractmethod
    def score(self, prediction: str, example: Example) -> dict[str, float]:
        """Metrics for one prediction; the first key is the task's primary metric."""

    def score_logprobs(self, logprobs: list[float], example: Example) -> dict[str, float]:
        """Metrics from the log-probabilities of ``example.forced_ids`` (teacher-forced tasks)."""
        raise NotImplementedError(f"task {self.name!r} does not teacher-force")

    def identity(self) -> dict[str, Any]:
        """Config fields that change what an example *is* (enter the run id).

        Fields that only select which examples to run (counts, subtask lists, lengths) stay
        out, so widening a run resumes into the same results folder.
        """
        return {}

    def stop_strings(self, example: Example) -> list[str]:
        """Strings that end generation early (beyond the model's end-of-turn token)."""
        return []

    def follow_up(self, tokenizer: Any, example: Example, prediction: str) -> Example | None:
        """A second, document-free generation the protocol makes from ``prediction``, or None.

        LongBench-v2's CoT protocol asks for the answer letter in a separate call that shows the
        question and the first call's reasoning. The harness runs it with the full cache (the
        method under test already shaped the reasoning) and scores its output instead.
        """
        return None


def require_int(field_name: str, value: Any, minimum: int = 1, optional: bool = False) -> None:
    """Refuse a task option that is not an integer >= ``minimum`` (``None`` too when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"null or an integer >= {minimum}" if optional else f"an integer >= {minimum}"
        raise ValueError(f"task.{field_name} must be {allowed}, got {value!r}")
