"""FD-KVC's figures (arXiv 2608.18098) from the dialog world's records, in the paper's world.

Fig. 1: per-turn alignment (and retention); Fig. 2: ownership loss and adaptive rate per turn
in the Mixed dialogs; Fig. 3: A and B retention around the Topic Shift switch; Fig. 4: the
w_c and γ ablation curves, alignment and retention.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.figures.common import Figure, save  # noqa: E402
from harness.analysis.papers.fdkvc import GAMMAS, METHODS, NAMES, W_C, WORLD, w_c_pair  # noqa: E402
from harness.analysis.shared import among  # noqa: E402
from harness.analysis.spec import one_per_example, restrict  # noqa: E402
from harness.analysis.variants import display, variant  # noqa: E402
from harness.record.files import read_records  # noqa: E402


def _runs(frame: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """One row per run of the paper's world whose variant is one of ``variants``, in that order."""
    runs = restrict(frame, {**WORLD, "variant": variants}).drop_duplicates("run_id")
    return runs.sort_values("variant", key=lambda column: column.map(variants.index))


def _series(root: Path, run_id: str, subtask: str, dialogs: set[str]) -> Iterator[dict]:
    """The per-turn series (``meta.turns``) of ``run_id``'s records of the ``dialogs`` in ``subtask``."""
    for record in read_records(root / run_id / "records.jsonl"):
        if record["subtask"] == subtask and record["example_id"] in dialogs:
            yield (record.get("meta") or {}).get("turns") or {}


def _shared(frame: pd.DataFrame, runs: pd.DataFrame, subtask: str) -> set[str]:
    """The dialogs of ``subtask`` that every one of ``runs`` recorded: the curves of one figure average one sample
    (FD-KVC's default run may also hold ``fdkvc_tables``' 600 dialogs beside an ablation's 200)."""
    scenario = restrict(frame, {**WORLD, "subtask": subtask})
    return set(among(scenario, [{"variant": name} for name in runs["variant"].unique()])["example_id"])


def dialog_turns(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 1: mean alignment and retention per turn, per scenario, one line per method."""
    runs = _runs(frame, list(METHODS))
    scenarios = [s for s in NAMES if s in set(restrict(frame, WORLD)["subtask"])]
    if runs.empty or not scenarios:
        return []
    fig, axes = plt.subplots(2, len(scenarios), figsize=(3.2 * len(scenarios), 5.5), squeeze=False, sharey="row")
    for col, scenario in enumerate(scenarios):
        dialogs = _shared(frame, runs, scenario)
        for run_id, name in runs[["run_id", "variant"]].itertuples(index=False):
            series = list(_series(root, run_id, scenario, dialogs))
            for row, metric in enumerate(("alignment", "retention")):
                curve = pd.DataFrame([s[metric] for s in series if metric in s]).mean()
                axes[row][col].plot(curve.index + 1, curve.to_numpy(), label=display(name), linewidth=1.2)
        axes[0][col].set_title(NAMES[scenario], fontsize=9)
        axes[1][col].set_xlabel("turn")
    axes[0][0].set_ylabel("alignment")
    axes[1][0].set_ylabel("retention")
    axes[0][-1].legend(fontsize=7)
    return [save(fig, out / "fdkvc_fig1_turns.png")]


def ownership(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 2: FD-KVC's ownership loss and adaptive rate per turn over the Mixed dialogs (mean and one dialog)."""
    runs = _runs(frame, ["fdkvc"])
    if runs.empty:
        return []
    series = [
        s
        for s in _series(root, runs["run_id"].iloc[0], "mixed", _shared(frame, runs, "mixed"))
        if "ownership_loss" in s
    ]
    if not series:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, name, label in ((axes[0], "ownership_loss", "ownership loss L_t"), (axes[1], "rate", "rate α_t")):
        values = pd.DataFrame([s[name] for s in series])
        ax.plot(values.columns + 1, values.mean().to_numpy(), label=f"mean of {len(series)} dialogs", linewidth=1.4)
        ax.plot(values.columns + 1, values.iloc[0].to_numpy(), label="dialog 0", linewidth=0.9, linestyle=":")
        ax.set_xlabel("turn")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    return [save(fig, out / "fdkvc_fig2_ownership.png")]


def topic_shift_retention(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 3: share of the cache on topic A and on topic B per turn of Topic Shift, per method."""
    runs = _runs(frame, ["fifo", "h2o", "fdkvc"])
    if runs.empty:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    drawn = False
    dialogs = _shared(frame, runs, "topic_shift")
    for (run_id, name), colour in zip(runs[["run_id", "variant"]].itertuples(index=False), "bgr", strict=False):
        shares = [s["topic_retention"] for s in _series(root, run_id, "topic_shift", dialogs) if "topic_retention" in s]
        if not shares:
            continue
        mean = pd.DataFrame([[turn[k] for turn in dialog] for dialog in shares for k in (0, 1)])
        a, b = mean.iloc[0::2].mean(), mean.iloc[1::2].mean()
        ax.plot(a.index + 1, 100 * a.to_numpy(), color=colour, linestyle="--", label=f"{display(name)}: A")
        ax.plot(b.index + 1, 100 * b.to_numpy(), color=colour, label=f"{display(name)}: B")
        drawn = True
    if not drawn:
        plt.close(fig)
        return []
    ax.axvline(3.5, color="grey", linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel("% of cache on topic")
    ax.legend(fontsize=7)
    return [save(fig, out / "fdkvc_fig3_topic_shift.png")]


def ablations(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 4: alignment (red) and retention (blue dashed) on Mixed along the w_c and γ grids."""
    mixed = restrict(frame, {**WORLD, "subtask": "mixed"})
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    drawn = False
    for ax, grid, params, label in ((axes[0], W_C, w_c_pair, "w_c"), (axes[1], GAMMAS, lambda v: {"gamma": v}, "γ")):
        points = []
        # The dialogs every grid value ran: the default's run also holds fdkvc_tables' 600.
        curve = {value: {"variant": variant("fdkvc", params(value))} for value in grid}
        shared = among(mixed, list(curve.values()))
        for value in grid:
            records = one_per_example(restrict(shared, curve[value]))
            if not records.empty:
                points.append((value, records["metric.alignment"].mean(), records["metric.retention"].mean()))
        if not points:
            continue
        x, alignment, retention = zip(*points, strict=True)
        ax.plot(x, alignment, color="red", marker="o", label="alignment")
        twin = ax.twinx()
        twin.plot(x, retention, color="blue", linestyle="--", marker="s", label="retention")
        ax.set_xlabel(label)
        ax.set_ylabel("alignment", color="red")
        twin.set_ylabel("retention", color="blue")
        drawn = True
    if not drawn:
        plt.close(fig)
        return []
    return [save(fig, out / "fdkvc_fig4_ablations.png")]


FIGURES: dict[str, Figure] = {
    "FD-KVC Fig. 1: per-turn alignment and retention": Figure(dialog_turns, "fdkvc_tables"),
    "FD-KVC Fig. 2: ownership loss and adaptive rate": Figure(ownership, "fdkvc_tables"),
    "FD-KVC Fig. 3: topic retention around the switch": Figure(topic_shift_retention, "fdkvc_tables"),
    "FD-KVC Fig. 4: ablation curves": Figure(ablations, "fdkvc_table5"),
}
