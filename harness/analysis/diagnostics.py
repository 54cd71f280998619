"""Reading the rank-trace diagnostics that ``diagnostics=true`` runs write (``harness.decode.retention``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.decode.retention import FILENAME, FIRST_STEP, SUMMARY
from harness.record.files import read_records
from harness.record.schema import RunId


def read_diagnostics(folder: Path | str) -> list[dict[str, Any]]:
    """The lines of ``<folder>/diagnostics.jsonl``: one per example, each with its record.

    A line that has no record yet (its run is being written, or was killed before the record)
    is left out; the next writer of the run removes the latter.
    """
    path = Path(folder) / FILENAME
    if not path.is_file():
        return []
    recorded = {record["example_id"] for record in read_records(Path(folder) / "records.jsonl")}
    return [line for line in read_records(path) if line["example_id"] in recorded]


def _record_fields(record: dict[str, Any]) -> dict[str, Any]:
    """What a diagnostics row takes from its example's record: the primary score and scalar meta."""
    metrics = record.get("metrics") or {}
    fields: dict[str, Any] = {"score": next(iter(metrics.values()), None), "primary_metric": next(iter(metrics), None)}
    for key, value in (record.get("meta") or {}).items():
        if isinstance(value, str | int | float | bool) or value is None:
            fields[f"meta.{key}"] = value
    return fields


def load_diagnostics(root: Path | str = "results") -> pd.DataFrame:
    """One row per example of every ``<root>/<run id>/diagnostics.jsonl``.

    Columns: the results table's identity columns, ``metric.<name>`` for every summary measure
    (``SUMMARY``, ``FIRST_STEP`` and whatever an adaptive aggregator reported), the example's
    ``score`` and scalar ``meta.<key>`` from its record, and ``kept`` (the retained positions per
    step, when the line carries them).
    """
    rows = []
    for path in sorted(Path(root).glob(f"*/{FILENAME}")) if Path(root).exists() else []:
        run = RunId.parse(path.parent.name)
        identity = {name: getattr(run, name) for name in run.__dataclass_fields__}
        records = {record["example_id"]: record for record in read_records(path.parent / "records.jsonl")}
        for line in read_diagnostics(path.parent):
            rows.append(
                {
                    **identity,
                    "rho": float(identity["rho"]),
                    "seed": int(identity["seed"]),
                    "run_id": path.parent.name,
                    "example_id": line["example_id"],
                    "subtask": line.get("subtask"),
                    **_record_fields(records[line["example_id"]]),
                    **{f"metric.{k}": v for k, v in (line.get("summary") or {}).items()},
                    "kept": line.get("kept"),
                }
            )
    measures = [f"metric.{k}" for k in (*SUMMARY, *FIRST_STEP)]
    columns = [*RunId.__dataclass_fields__, "run_id", "example_id", "subtask", "score", *measures, "kept"]
    frame = pd.DataFrame(rows, columns=list(dict.fromkeys([*columns, *(k for row in rows for k in row)])))
    for column in (c for c in frame.columns if c.startswith("metric.")):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["score"] = pd.to_numeric(frame["score"], errors="coerce")
    return frame


def traced_lines(folder: Path | str) -> dict[str, dict[str, Any]]:
    """A run's diagnostics lines that carry retained sets, by example id (Figure 1's panels)."""
    return {line["example_id"]: line for line in read_diagnostics(folder) if line.get("kept")}
