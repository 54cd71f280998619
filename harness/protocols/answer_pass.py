"""``GENERATE_THEN_ANSWER``: decode under the method, then a second pass with the full cache gives the answer.

LongBench-v2's CoT protocol: the method shapes the reasoning; the answer letter comes from a
separate call that shows the question and that reasoning (``Task.follow_up``), decoded with the
full cache, and that answer is scored. The record keeps the first text and the answer pass's sizes.
"""

from __future__ import annotations

from harness.decode.engine import Generation
from harness.protocols.base import Runner
from harness.protocols.requests import example_request
from harness.record.schema import Outcome, figures_of
from tasks.base import Example

#: What a record keeps of the answer pass.
ANSWER_PASS_FIELDS = ("prefill_len", "new_tokens", "prefill_s", "decode_s")


class AnswerPassRunner(Runner):
    def finish(self, example: Example, generations: list[Generation]) -> Outcome:
        (generation,) = generations
        context = self.context
        prediction = self.decoded(generation)
        meta = self.sequence_meta(example, generation)
        follow_up = context.task.follow_up(context.tokenizer, example, prediction)
        if follow_up is not None:
            request = example_request(context.task, follow_up, context.tokenizer, context.stops, context.seed)
            answer = context.full_engine.generate(request)
            meta["first_prediction"] = prediction
            meta["answer_pass"] = {name: getattr(answer, name) for name in ANSWER_PASS_FIELDS}
            prediction, example = self.decoded(answer), follow_up
        return Outcome(prediction, context.task.score(prediction, example), figures_of(generation), meta)
