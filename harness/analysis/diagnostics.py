"""Reading the rank-trace diagnostics that ``diagnostics=true`` runs write (``harness.diagnostics``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from harness.diagnostics import FILENAME, SUMMARY
from harness.records import read_records
from harness.schema import RunId


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


def load_diagnostics(root: Path | str = "results") -> pd.DataFrame:
    """One row per example of every ``<root>/<run id>/diagnostics.jsonl``, with the results table's
    identity columns and ``metric.<name>`` for every ``SUMMARY`` measure."""
    rows = []
    for path in sorted(Path(root).glob(f"*/{FILENAME}")) if Path(root).exists() else []:
        run = RunId.parse(path.parent.name)
        identity = {name: getattr(run, name) for name in run.__dataclass_fields__}
        for line in read_diagnostics(path.parent):
            rows.append(
                {
                    **identity,
                    "rho": float(identity["rho"]),
                    "seed": int(identity["seed"]),
                    "run_id": path.parent.name,
                    "example_id": line["example_id"],
                    "subtask": line.get("subtask"),
                    **{f"metric.{k}": v for k, v in (line.get("summary") or {}).items()},
                }
            )
    columns = [*RunId.__dataclass_fields__, "run_id", "example_id"]
    frame = pd.DataFrame(rows, columns=[*columns, "subtask", *(f"metric.{k}" for k in SUMMARY)])
    for name in SUMMARY:
        frame[f"metric.{name}"] = pd.to_numeric(frame[f"metric.{name}"], errors="coerce")
    return frame


def kept_rasters(folder: Path | str, limit: int = 1) -> Iterable[dict[str, Any]]:
    """The first ``limit`` diagnostics lines of a run that carry retained sets (for the panels)."""
    return [line for line in read_diagnostics(folder) if line.get("kept")][:limit]
