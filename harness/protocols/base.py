"""How a task protocol turns an example into engine requests, and the generations back into an ``Outcome``.

One runner per ``tasks.base.TaskProtocol`` run on a model (``generate``, ``teacher_forced``,
``answer_pass``, ``calls``); the dialog world, which needs no model, is ``dialog_world``. A runner
knows the task and the tokenizer, never the record: ``harness.run`` turns its outcomes into
records (``harness.record.assemble``)::

    runner = RUNNERS[task.protocol](context)
    requests = runner.requests(example)              # one per model call
    outcome = runner.finish(example, generations)    # the generations in request order
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from harness.decode.engine import Engine, Generation, Request
from harness.protocols.requests import example_request
from harness.record.schema import Outcome
from tasks.base import Example, Task


@dataclass
class Context:
    """What every runner of one run shares.

    Parameters:
        task: the task whose examples it runs.
        tokenizer: the model's tokenizer.
        stops: the model's end-of-turn token ids.
        seed: the run's seed (each example's sampling seed derives from it and the example id).
        full_engine: the same model with the full cache, for a protocol's full-cache pass.
    """

    task: Task
    tokenizer: Any
    stops: set[int]
    seed: int
    full_engine: Engine


class Runner(ABC):
    """One protocol's requests and outcomes (the default: one request per example)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def requests(self, example: Example) -> list[Request]:
        """The engine requests ``example`` is made of, in order."""
        context = self.context
        return [example_request(context.task, example, context.tokenizer, context.stops, context.seed)]

    @abstractmethod
    def finish(self, example: Example, generations: list[Generation]) -> Outcome:
        """The outcome of ``example`` from its requests' generations."""

    def decoded(self, generation: Generation) -> str:
        return self.context.tokenizer.decode(generation.tokens, skip_special_tokens=True)

    def sequence_meta(self, example: Example, generation: Generation) -> dict[str, Any]:
        """What a one-sequence example's record keeps in ``meta`` beyond the figures: the cache's largest
        length, what the method reported, and the tokens of a retention pattern's positions."""
        meta: dict[str, Any] = {"max_cache_len": generation.max_cache_len, **generation.method_report}
        if "pattern_positions" in generation.method_report:
            # A retention pattern names sequence positions; the record keeps their tokens for the figure.
            sequence = example.input_ids + generation.tokens
            decode = self.context.tokenizer.decode
            meta["pattern_tokens"] = [decode([sequence[p]]) for p in generation.method_report["pattern_positions"]]
        return meta
