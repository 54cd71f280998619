"""Every run under ``results/`` as one pandas table, one row per recorded example.

A row's identity is ``IDENTITY`` (model, method and its parameter hash, task, subtask, rho,
seed, the generation limit, example id). Two records claiming one identity, in whichever run
folders, are an error naming both files: averaging or silently keeping one of them would make a
table depend on which stale folder happened to be read last. A corrupt line is an error naming the
file and line (``harness.record.files.read_records``); a torn final line, the trace of an
interrupted write, is dropped with a warning as everywhere else.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.record.files import CorruptRecordsError, DuplicateRecordError, read_records
from harness.record.schema import NUMERIC_FIELDS, RunId

log = logging.getLogger(__name__)

#: The task setting a preset sweeps (KVpop Fig. 4: latency against the generation limit), read from
#: the record's task identity: the same example id decoded under each limit is a condition of its own.
GENERATION_LIMIT = "task.max_new_tokens"

# What makes two records "the same example under the same configuration". The task hash of
# the run id is deliberately not part of it: a task whose definition changed would otherwise
# leave two result sets for one example id side by side, and every table would mix them. Such
# a clash is reported instead, so the stale folder gets moved away. The generation limit is the
# one task setting in it, since a sweep varies it on purpose.
IDENTITY: tuple[str, ...] = (
    "model",
    "model_params",
    "method",
    "method_params",
    "task",
    "subtask",
    "rho",
    "seed",
    GENERATION_LIMIT,
    "example_id",
)

# Columns present even when no record exists, so callers can filter an empty table without
# special cases.
BASE_COLUMNS: tuple[str, ...] = (
    *IDENTITY,
    "run_id",
    "task_params",
    "primary_metric",
    "score",
    *NUMERIC_FIELDS,
    "prediction",
    "source",
)


def parse_run_id(run_id: str) -> dict[str, str | None]:
    """The parts of a run id (``harness.record.schema.RunId``) as a dict; raises ``ValueError`` for anything else."""
    parsed = RunId.parse(run_id)
    return {name: getattr(parsed, name) for name in parsed.__dataclass_fields__}


def run_folders(root: Path) -> list[Path]:
    """The run folders under ``root`` that hold a records file."""
    # One level deep only: results/<run id>/records.jsonl. Hidden folders (.hydra logs and
    # the like) never hold runs, and tables/ and figures/ hold no records file.
    return sorted(
        path.parent for path in root.glob("*/records.jsonl") if not path.parent.name.startswith(".") and path.is_file()
    )


def _row(record: dict[str, Any], path: Path, number: int, fallback_run_id: str) -> dict[str, Any]:
    run_id = record.get("run_id") or fallback_run_id
    try:
        parsed = parse_run_id(run_id)
    except ValueError as error:
        raise CorruptRecordsError(f"{path}: record {number}: {error}") from error
    metrics = record.get("metrics") or {}
    if not isinstance(metrics, dict) or not metrics:
        raise CorruptRecordsError(f"{path}: record {number} (example_id={record['example_id']!r}) has no metrics")
    primary = next(iter(metrics))
    row: dict[str, Any] = {
        # The record's own fields win over the run id's: the run id only adds what a record
        # does not carry (the parameter hashes), and stands in for a field an older record lacks.
        "model": record.get("model", parsed["model"]),
        "model_params": parsed["model_params"],
        "method": record.get("method", parsed["method"]),
        "method_params": parsed["method_params"],
        "task": record.get("task", parsed["task"]),
        "subtask": record.get("subtask"),
        "rho": float(record.get("rho", parsed["rho"])),
        "seed": int(record.get("seed", parsed["seed"])),
        # Tasks without a limit in their protocol (RULER: fixed per subtask) and older records: None.
        GENERATION_LIMIT: ((record.get("identity") or {}).get("task") or {}).get("max_new_tokens"),
        "example_id": record["example_id"],
        "run_id": run_id,
        "task_params": parsed["task_params"],
        "primary_metric": primary,
        "score": metrics[primary],
        "prediction": record.get("prediction"),
        "source": str(path),
    }
    for field in NUMERIC_FIELDS:
        row[field] = record.get(field)
    for name, value in metrics.items():
        row[f"metric.{name}"] = value
    # Scalar meta (RULER's length and depth, a dialog's turn) is what figures group by.
    for key, value in (record.get("meta") or {}).items():
        if isinstance(value, str | int | float | bool) or value is None:
            row[f"meta.{key}"] = value
    return row


def _check_unique(frame: pd.DataFrame) -> None:
    clashes = frame[frame.duplicated(list(IDENTITY), keep=False)]
    if clashes.empty:
        return
    groups = clashes.groupby(list(IDENTITY), dropna=False, sort=False)
    first_key, first = next(iter(groups))
    files = sorted(set(first["source"]))
    identity = ", ".join(f"{k}={v!r}" for k, v in zip(IDENTITY, first_key, strict=True))
    count = groups.ngroups
    raise DuplicateRecordError(
        f"{' and '.join(files)} both record {identity}"
        f" ({count} identit{'y' if count == 1 else 'ies'} recorded more than once in all);"
        " move the stale run folder out of the results root"
    )


def load_results(root: Path | str = "results") -> pd.DataFrame:
    """One row per record of every ``<root>/<run id>/records.jsonl``.

    Columns: ``IDENTITY`` (``task.max_new_tokens``: the generation limit of the task's protocol,
    where it has one), ``run_id``, ``task_params`` (the run id's task hash),
    ``primary_metric`` (name of the record's first metric) and ``score`` (its value),
    ``metric.<name>`` for every metric, the numeric record fields ``NUMERIC_FIELDS``,
    ``prediction``, ``meta.<key>`` for scalar meta fields, and ``source`` (the records file).

    Raises ``CorruptRecordsError`` naming file and line for a corrupt line, and
    ``DuplicateRecordError`` naming both files when two records share an identity. A root
    without runs (or a missing root: a fresh clone has none) gives an empty table with the
    base columns.
    """
    root = Path(root)
    if not root.exists():
        log.warning("%s does not exist: no results loaded", root)
    rows: list[dict[str, Any]] = []
    for folder in run_folders(root) if root.exists() else []:
        path = folder / "records.jsonl"
        for number, record in enumerate(read_records(path), start=1):
            rows.append(_row(record, path, number, folder.name))
    if not rows:
        return pd.DataFrame({column: pd.Series(dtype=object) for column in BASE_COLUMNS})
    frame = pd.DataFrame(rows)
    _check_unique(frame)
    # Base columns first, in a fixed order; then metrics and meta, sorted, so the layout does
    # not depend on which run was read first.
    extra = sorted(c for c in frame.columns if c not in BASE_COLUMNS)
    frame = frame[[*BASE_COLUMNS, *extra]]
    # A metric undefined for an example is null in the records (strict JSON): NaN here.
    for field in ("score", *NUMERIC_FIELDS, *(c for c in frame.columns if c.startswith("metric."))):
        frame[field] = pd.to_numeric(frame[field], errors="coerce")
    return frame.reset_index(drop=True)


class MixedTimingsError(ValueError):
    """Timings measured at different batch sizes would be averaged or compared."""


#: What a results root can hold wrong (a foreign or torn record, one identity recorded twice, timings of
#: several batch sizes): one line each. Anything else raised while the tables are made is a bug in them and
#: keeps its traceback.
RESULTS_MISTAKES: tuple[type[Exception], ...] = (CorruptRecordsError, DuplicateRecordError, MixedTimingsError)


def one_batch_size(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    """``rows`` unchanged if every one was decoded at the same batch size; raises ``MixedTimingsError`` otherwise.

    A batched run has its own run id (since schema version 2), but a figure may still select runs of
    several batch sizes, and their timings are not comparable: a batched sequence's ``decode_s`` is
    the wall time of steps it shared. A figure or cell that averages or compares timings (``what``
    names it) calls this first. Records made before batching existed carry no batch size and were
    decoded alone.
    """
    sizes = rows["meta.batch_size"].fillna(1) if "meta.batch_size" in rows else pd.Series(1, index=rows.index)
    if sizes.nunique() <= 1:
        return rows
    runs = sorted(f"{run} ({', '.join(str(int(b)) for b in sorted(part.unique()))})"
                  for run, part in sizes.groupby(rows["run_id"]))  # fmt: skip
    raise MixedTimingsError(
        f"{what} would mix timings decoded at batch sizes {sorted(int(b) for b in sizes.unique())}: runs"
        f" {'; '.join(runs)} — rerun them at one batch_size into a fresh results_dir (timings of"
        " different batch sizes are not comparable)"
    )


def load_configs(root: Path | str = "results") -> dict[str, dict[str, Any]]:
    """The resolved config (``config.yaml``) of every run under ``root``, keyed by run id.

    ``method_params`` in the results table is only a hash; tables that vary a method
    parameter (alpha sweep, scorer ablation) read the parameter itself from here.
    """
    root = Path(root)
    configs: dict[str, dict[str, Any]] = {}
    if not root.exists():
        return configs
    for folder in run_folders(root):
        path = folder / "config.yaml"
        if path.is_file():
            configs[folder.name] = yaml.safe_load(path.read_text()) or {}
    return configs
