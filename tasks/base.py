"""What every task provides to the harness.

A task knows nothing of eviction methods: it synthesises or loads examples, turns one into
prompt token ids following its benchmark's official protocol, and scores what comes back.
It declares which of four protocols the harness runs its examples with (``TaskProtocol``)::

    examples = task.examples(tokenizer)                  # stable example ids
    per example, by task.protocol:
      GENERATE              decode under the method      -> task.score(text, example)
      TEACHER_FORCED        feed example.forced_ids      -> task.score_logprobs(logprobs, example)
      GENERATE_THEN_ANSWER  decode under the method, then task.follow_up(tokenizer, example, text)
                            decoded with the full cache  -> task.score(answer, follow-up example)
      CALLS                 serve every call of example.calls under the method
                                                 -> task.score_calls(results, example)
      WORLD                 no model: task.run_batches(policy, examples) -> the records' outcomes
                            (``policy``: the method as the harness adapts it to the world)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Call:
    """One model call of a ``CALLS`` example: a generation, or a teacher-forced continuation.

    Parameters:
        input_ids: prompt token ids.
        max_new_tokens: generation limit (the continuation's length when teacher-forced).
        forced_ids: a continuation to teacher-force and score instead of generating.
        stop_strings: strings that end the generation early.
        sampling: temperature, top_k and top_p of this call (None: the run's sampling).
        seed_key: what the call's sampling seed derives from (None: the example id).
        ranked: the continuation is ranked against the example's other continuations (a
            multiple-choice option), which the harness refuses where the method evicts the
            prompt it is scored against.
    """

    input_ids: list[int]
    max_new_tokens: int
    forced_ids: list[int] | None = None
    stop_strings: list[str] = field(default_factory=list)
    sampling: dict[str, float] | None = None
    seed_key: str | None = None
    ranked: bool = False


@dataclass
class CallResult:
    """What one ``Call`` gave.

    Parameters:
        text: the generated text, special tokens stripped (empty when teacher-forced).
        logprobs: per forced token, its log-probability.
        greedy: per forced token, whether it was the model's most likely token.
    """

    text: str
    logprobs: list[float] = field(default_factory=list)
    greedy: list[bool] = field(default_factory=list)


@dataclass
class Scored:
    """``CALLS``: what a record keeps of an example's results: the prediction, the metrics, details for ``meta``."""

    prediction: str
    metrics: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)


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
        calls: ``CALLS``: the model calls the example is made of, in order (``input_ids`` and
            ``max_new_tokens`` then describe the longest of them).
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
    calls: list[Call] = field(default_factory=list)


class TaskProtocol(Enum):
    """How the harness runs a task's examples (see the module docstring)."""

    GENERATE = "generate"
    TEACHER_FORCED = "teacher_forced"
    GENERATE_THEN_ANSWER = "generate_then_answer"
    CALLS = "calls"
    WORLD = "world"


class Task(ABC):
    """A benchmark suite. Subclasses are dataclasses built from ``conf/task/*.yaml``."""

    name: str

    @property
    def protocol(self) -> TaskProtocol:
        """The protocol the harness runs this task's examples with."""
        return TaskProtocol.GENERATE

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
        """``GENERATE_THEN_ANSWER``: the second generation made from ``prediction``, or None to score it as is.

        LongBench-v2's CoT protocol asks for the answer letter in a separate call that shows the
        question and the first call's reasoning. The harness runs it with the full cache (the
        method under test already shaped the reasoning) and scores its output instead.
        """
        raise NotImplementedError(f"task {self.name!r} makes no follow-up generation")

    def score_calls(self, results: list[CallResult], example: Example) -> Scored:
        """``CALLS``: the record's prediction and metrics from the result of every call, in order."""
        raise NotImplementedError(f"task {self.name!r} makes no calls of its own")

    def run_example(self, policy: Any, example: Example) -> dict[str, Any]:
        """``WORLD``: run ``policy`` through ``example`` and return the record's outcome fields."""
        raise NotImplementedError(f"task {self.name!r} runs on a model, not in a world of its own")

    def run_batches(self, policy: Any, examples: list[Example]) -> Iterator[list[tuple[Example, dict[str, Any]]]]:
        """``WORLD``: the outcomes of ``examples`` in batches, each recorded in one write.

        One example per batch by default; a world that simulates many examples at once yields
        them together.
        """
        for example in examples:
            yield [(example, self.run_example(policy, example))]


def as_list(field_name: str, value: Any) -> list[Any]:
    """A list option given as a list, or as one value (``task.tasks=vt`` means ``[vt]``)."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"task.{field_name}={value!r} is not a list — use e.g. task.{field_name}=[a,b]") from None


def as_dict(field_name: str, value: Any) -> dict[Any, Any]:
    """A mapping option as a plain dict (Hydra hands over a DictConfig)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"task.{field_name}={value!r} is not a mapping — use e.g. task.{field_name}='{{key: value}}'")
    return dict(value)


def require_int(
    field_name: str, value: Any, minimum: int | None = 1, optional: bool = False, example: int | None = None
) -> None:
    """Refuse a task option that is not an integer >= ``minimum`` (any integer when ``minimum`` is None).

    ``None`` passes when ``optional``; ``example`` is the value the message suggests (``minimum`` by default).
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        kind = "an integer" if minimum is None else f"an integer >= {minimum}"
        allowed = f"null or {kind}" if optional else kind
        suggested = example if example is not None else (minimum or 0)
        raise ValueError(f"task.{field_name}={value!r} must be {allowed} — use e.g. task.{field_name}={suggested}")


def require_number(field_name: str, value: Any, example: float, minimum: float | None = None) -> None:
    """Refuse a task option that is not a number (>= ``minimum`` when given)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (minimum is not None and value < minimum):
        allowed = "a number" if minimum is None else f"a number >= {minimum:g}"
        raise ValueError(f"task.{field_name}={value!r} must be {allowed} — use e.g. task.{field_name}={example:g}")


def require_once(field_name: str, values: list[Any]) -> None:
    """Refuse a list option that names one value twice."""
    twice = [value for value in dict.fromkeys(values) if values.count(value) > 1]
    if twice:
        raise ValueError(f"task.{field_name}={values!r} lists {twice[0]!r} twice — list each value once")


def require_lengths(field_name: str, values: list[Any], shortest: int, why: str) -> None:
    """Refuse prompt lengths that are not distinct integers >= ``shortest`` (``why`` names that bound)."""
    if not values:
        raise ValueError(f"task.{field_name}=[] is empty — use e.g. task.{field_name}=[{max(shortest, 4096)}]")
    for length in values:
        if isinstance(length, bool) or not isinstance(length, int) or length < shortest:
            raise ValueError(
                f"task.{field_name}={values!r} has {length!r}, not an integer above {why} — use lengths >= "
                f"{shortest}, e.g. task.{field_name}=[{max(shortest, 4096)}]"
            )
    require_once(field_name, values)


def require_str(field_name: str, value: Any, optional: bool = True) -> None:
    """Refuse a text or path option that Hydra parsed as something else (``task.revision=1234`` is an int)."""
    if (optional and value is None) or isinstance(value, str):
        return
    raise ValueError(f"task.{field_name}={value!r} is not a string — quote it: task.{field_name}='{value}'")
