"""FD-KVC's figures: per-turn alignment and retention in the dialog world."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.figures.common import Figure, save  # noqa: E402
from harness.analysis.variants import display  # noqa: E402
from harness.records import read_records  # noqa: E402


def dialog_turns(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Dialog world: mean alignment and retention per turn, per scenario, one line per method."""
    runs = frame.loc[frame["task"] == "dialogs"].drop_duplicates("run_id")
    runs = runs[runs["variant"] == runs["method"]]
    if runs.empty:
        return []
    turns: list[dict] = []
    for run_id, name in runs[["run_id", "variant"]].itertuples(index=False):
        for record in read_records(root / run_id / "records.jsonl"):
            series = (record.get("meta") or {}).get("turns") or {}
            for metric in ("alignment", "retention"):
                for turn, value in enumerate(series.get(metric, []), start=1):
                    turns.append({"variant": name, "scenario": record["subtask"], "metric": metric, "turn": turn,
                                  "value": value})  # fmt: skip
    if not turns:
        return []
    data = pd.DataFrame(turns)
    scenarios = sorted(data["scenario"].unique())
    fig, axes = plt.subplots(2, len(scenarios), figsize=(3.2 * len(scenarios), 5.5), squeeze=False, sharey="row")
    for row, metric in enumerate(("alignment", "retention")):
        for col, scenario in enumerate(scenarios):
            ax = axes[row][col]
            part = data[(data["metric"] == metric) & (data["scenario"] == scenario)]
            for name, r in part.groupby("variant"):
                curve = r.groupby("turn")["value"].mean()
                ax.plot(curve.index, curve.to_numpy(), label=display(name), linewidth=1.2)
            ax.set_title(scenario if row == 0 else "", fontsize=9)
            ax.set_xlabel("turn" if row == 1 else "")
        axes[row][0].set_ylabel(metric)
    axes[0][-1].legend(fontsize=7)
    return [save(fig, out / "dialog_turns.png")]


FIGURES: dict[str, Figure] = {"dialog per-turn alignment/retention": dialog_turns}
