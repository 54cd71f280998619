"""Examples through the model: the engine under the method, each protocol's runner, batches of sequences."""

from __future__ import annotations

from collections.abc import Iterator

from harness.decode.engine import Engine
from harness.decode.retention import RetentionRecorder
from harness.decode.sampling import Sampling
from harness.protocols.answer_pass import AnswerPassRunner
from harness.protocols.base import Context, Runner
from harness.protocols.calls import CallsRunner
from harness.protocols.generate import GenerateRunner
from harness.protocols.requests import stop_token_ids
from harness.protocols.teacher_forced import TeacherForcedRunner
from harness.record.schema import Outcome
from methods.base import EvictionMethod
from methods.full import FullCache
from tasks.base import Example, Task, TaskProtocol

#: The runner of each protocol that runs on a model.
RUNNERS: dict[TaskProtocol, type[Runner]] = {
    TaskProtocol.GENERATE: GenerateRunner,
    TaskProtocol.TEACHER_FORCED: TeacherForcedRunner,
    TaskProtocol.GENERATE_THEN_ANSWER: AnswerPassRunner,
    TaskProtocol.CALLS: CallsRunner,
}


def run_on_model(
    model: object,
    task: Task,
    method: EvictionMethod,
    tokenizer: object,
    sampling: Sampling,
    seed: int,
    batch_size: int,
    diagnostics: bool,
    todo: list[Example],
    profile: bool = False,
    numerics: int = 1,
) -> Iterator[list[tuple[Example, Outcome]]]:
    """The outcome of every example of ``todo``, as each finishes (in batches of one).

    With ``batch_size`` > 1 the examples' sequences decode together (``Engine.generate_batch``), so
    outcomes come as examples finish, not in order. With ``diagnostics`` every outcome carries its
    per-step retention trace (decode then computes attention weights at every step, so its timings
    are not comparable with a plain run's: such runs have their own run id). ``profile`` times the
    method and the gathers apart at every step (``Engine.profile``); ``numerics`` is ``Engine.numerics``.
    """
    engine = Engine(model, method, sampling, tokenizer=tokenizer, profile=profile, numerics=numerics)
    # Attached before the first sequence: the recorder wraps the method's scorer.
    recorder = RetentionRecorder.attach(engine) if diagnostics else None
    answering = Engine(model, FullCache(), sampling, numerics=numerics)
    context = Context(task, tokenizer, stop_token_ids(model, tokenizer), seed, answering)
    runner = RUNNERS[task.protocol](context)
    for number, generations in engine.generate_groups([runner.requests(e) for e in todo], batch_size):
        example = todo[number]
        trace = recorder.finish(example.example_id, example.subtask) if recorder is not None else None
        outcome = runner.finish(example, generations)
        outcome.meta["batch_size"] = batch_size
        outcome.trace = trace
        yield [(example, outcome)]
