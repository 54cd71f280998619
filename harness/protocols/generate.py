"""``GENERATE``: decode under the method, score the text (RULER, the needle grid, LongBench, math, code)."""

from __future__ import annotations

from harness.decode.engine import Generation
from harness.protocols.base import Runner
from harness.record.schema import Outcome, figures_of
from tasks.base import Example


class GenerateRunner(Runner):
    def finish(self, example: Example, generations: list[Generation]) -> Outcome:
        (generation,) = generations
        prediction = self.decoded(generation)
        metrics = self.context.task.score(prediction, example)
        return Outcome(prediction, metrics, figures_of(generation), self.sequence_meta(example, generation))
