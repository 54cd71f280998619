"""``TEACHER_FORCED``: feed the example's continuation under the method, score its log-probabilities (perplexity)."""

from __future__ import annotations

from harness.decode.engine import Generation
from harness.protocols.base import Runner
from harness.record.schema import Outcome, figures_of
from tasks.base import Example


class TeacherForcedRunner(Runner):
    def finish(self, example: Example, generations: list[Generation]) -> Outcome:
        (generation,) = generations
        metrics = self.context.task.score_logprobs(generation.target_logprobs, example)
        meta = self.sequence_meta(example, generation)
        return Outcome(self.decoded(generation), metrics, figures_of(generation), meta)
