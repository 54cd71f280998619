"""``CALLS``: serve every model call of an example under the method, score them together (lm-eval's requests)."""

from __future__ import annotations

from harness.decode.engine import Generation, Request
from harness.protocols.base import Runner
from harness.protocols.requests import call_request
from harness.record.schema import Outcome, combine_calls, figures_of
from tasks.base import CallResult, Example


class CallsRunner(Runner):
    def requests(self, example: Example) -> list[Request]:
        context = self.context
        return [
            call_request(call, context.tokenizer, context.stops, context.seed, example.example_id)
            for call in example.calls
        ]

    def finish(self, example: Example, generations: list[Generation]) -> Outcome:
        results = [
            CallResult(
                text=self.decoded(generation) if call.forced_ids is None else "",
                logprobs=generation.target_logprobs,
                greedy=generation.target_greedy,
            )
            for call, generation in zip(example.calls, generations, strict=True)
        ]
        scored = self.context.task.score_calls(results, example)
        figures = combine_calls([figures_of(generation) for generation in generations])
        meta = {"max_cache_len": max(g.max_cache_len for g in generations), "calls": len(generations), **scored.meta}
        return Outcome(scored.prediction, scored.metrics, figures, meta)
