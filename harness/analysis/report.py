"""``python -m harness.analysis.report [results_dir]``: one line per run, recomputed from its records.

A quick look at what is on disk; the papers' tables come from ``make tables``. Every records
file is read and checked (a corrupt line or a duplicate record is an error naming the file).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from harness.analysis.results import RESULTS_MISTAKES, load_results, run_folders
from harness.errors import UserError, cli, user_errors
from harness.record.files import read_records
from harness.record.schema import RunId
from harness.record.summary import summarize


def runs_table(root: Path) -> pd.DataFrame:
    """One row per run folder under ``root`` that holds records."""
    load_results(root)  # checks every line, and identities across folders
    rows = []
    for folder in run_folders(root):
        records = read_records(folder / "records.jsonl")
        if not records:
            continue
        summary = summarize(records)
        run = RunId.parse(folder.name)
        rows.append(
            {
                "model": run.model if run.model_params is None else f"{run.model}-{run.model_params}",
                "method": run.method,
                "task": run.task,
                "rho": float(run.rho),
                "seed": int(run.seed),
                "n": summary["n"],
                summary["primary_metric"]: round(summary["overall"], 2),
                "kv_ratio": round(summary["kv_ratio_final"], 3),
                "decode_tok_s": round(summary["decode_tokens_per_s"] or 0.0, 2),
                # Measured only by profiled runs (profile=true): otherwise it stays empty, not 0.
                "score_share": None if summary["score_share"] is None else round(summary["score_share"], 3),
            }
        )
    return pd.DataFrame(rows)


def existing_root(argv: list[str]) -> Path:
    """The results folder named by ``argv[0]`` (default ``results``), refused when it does not exist."""
    root = Path(argv[0] if argv else "results")
    if not root.is_dir():
        raise UserError(f"{root} is not a folder — pass the results folder of your runs (default: results)")
    return root


def main(argv: list[str]) -> None:
    root = existing_root(argv)
    with user_errors(RESULTS_MISTAKES):
        table = runs_table(root)
    if table.empty:
        print(f"no runs with records under {root}/")
        return
    print(table.sort_values(["task", "model", "rho", "method"]).to_string(index=False))


if __name__ == "__main__":
    cli(lambda: main(sys.argv[1:]))
