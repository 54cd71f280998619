"""``python -m harness.report [results_dir]``: one line per run from its ``summary.json``.

A quick look at what is on disk; the papers' tables come from ``make tables``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def runs_table(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        if not summary.get("n"):
            continue
        model, method, task, rho, seed = summary["run_id"].split("__")
        rows.append(
            {
                "model": model,
                "method": method.rsplit("-", 1)[0],
                "task": task.rsplit("-", 1)[0],
                "rho": float(rho.removeprefix("rho")),
                "seed": int(seed.removeprefix("seed")),
                "n": summary["n"],
                summary["primary_metric"]: round(summary["overall"], 2),
                "kv_ratio": round(summary["kv_ratio_final"], 3),
                "decode_tok_s": round(summary["decode_tokens_per_s"] or 0.0, 2),
                "score_share": round(summary["score_share"] or 0.0, 3),
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else "results")
    table = runs_table(root)
    if table.empty:
        print(f"no finished runs under {root}/")
        return
    print(table.sort_values(["task", "model", "rho", "method"]).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
