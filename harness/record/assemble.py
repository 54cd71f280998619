"""One record from one example's ``Outcome``: the schema's fields, in its order, the rest under ``meta``."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.record.identity import Identity
from harness.record.schema import SCHEMA_VERSION, Outcome, RunId, decode_rate


def make_record(
    run: RunId, identity: Identity, rho: float, seed: int, example: Any, outcome: Outcome
) -> dict[str, Any]:
    """One line of ``records.jsonl`` (``harness.record.schema.RECORD_FIELDS``).

    ``example`` is the task's ``Example`` (its id, subtask, answers and meta). Figures left unmeasured
    take their declared defaults; ``decode_tokens_per_s`` is derived where the producer left it out;
    floats are rounded to four decimals.
    """
    figures = outcome.figures
    if figures.decode_tokens_per_s is None:
        figures = dataclasses.replace(figures, decode_tokens_per_s=decode_rate(figures))
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": str(run),
        "model": run.model,
        "method": run.method,
        "task": run.task,
        "subtask": example.subtask,
        "rho": rho,
        "seed": seed,
        "example_id": example.example_id,
        "answers": example.answers,
        "prediction": outcome.prediction,
        "metrics": outcome.metrics,
    }
    for name, value in dataclasses.asdict(figures).items():
        record[name] = round(value, 4) if isinstance(value, float) else value
    record["identity"] = identity.fields()
    record["meta"] = {**example.meta, **outcome.meta}
    return record
