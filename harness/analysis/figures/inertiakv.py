"""InertiaKV's figures: quality vs budget, the needle heatmap, alpha sensitivity, decode throughput and
its composition, and the retention panels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.diagnostics import kept_rasters  # noqa: E402
from harness.analysis.figures.common import Figure, by_length, defaults_only, save  # noqa: E402
from harness.analysis.spec import benchmark_mean  # noqa: E402
from harness.analysis.variants import display  # noqa: E402
from harness.schema import RunId  # noqa: E402


def quality_vs_budget(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Per model and task: benchmark mean vs rho, one line per method, full cache dashed.

    A run over several context lengths gets one panel per length: averaging a 4k and a 32k
    score would hide exactly the degradation the figure is for.
    """
    made = []
    frame = defaults_only(frame[frame["task"] != "dialogs"])
    for (model, task), part in frame.groupby(["model", "task"]):
        if part.loc[part["variant"] != "full", "rho"].nunique() < 2:
            continue
        panels = by_length(part)
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), sharey=True, squeeze=False)
        for ax, (length, rows) in zip(axes[0], panels, strict=True):
            for name, runs in rows[rows["variant"] != "full"].groupby("variant"):
                curve = sorted((rho, benchmark_mean(r, "score")) for rho, r in runs.groupby("rho"))
                ax.plot([100 * r for r, _ in curve], [v for _, v in curve], marker="o", label=display(name))
            full = rows[rows["variant"] == "full"]
            if not full.empty:
                ax.axhline(
                    benchmark_mean(full, "score"), color="black", linestyle="--", linewidth=1, label="Full cache"
                )
            ax.set(xlabel="evicted share of the prompt cache ρ (%)")
            ax.set_title(f"{task}: quality vs budget ({model})" + (f", {length} tokens" if length else ""), fontsize=10)
            ax.legend(fontsize=8)
        axes[0][0].set_ylabel(part["primary_metric"].iloc[0])
        made.append(save(fig, out / f"quality_vs_budget_{task}_{model}.png"))
    return made


def needle_heatmap(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Needle grid: context length x depth, mean score, one panel per method and ratio."""
    needle = frame[frame["task"] == "needle"]
    if needle.empty or "meta.depth" not in needle.columns:
        return []
    made = []
    for (model, name, rho), part in needle.groupby(["model", "variant", "rho"]):
        grid = part.pivot_table(index="meta.depth", columns="meta.length", values="score", aggfunc="mean")
        fig, ax = plt.subplots(figsize=(1.2 + 0.6 * grid.shape[1], 1.2 + 0.35 * grid.shape[0]))
        top = 100 if grid.max().max() > 1 else 1
        image = ax.imshow(grid.to_numpy(), cmap="RdYlGn", vmin=0, vmax=top, aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [f"{int(c) // 1000}k" if c >= 1000 else str(c) for c in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [f"{d:g}%" for d in grid.index])
        ax.set(xlabel="context length (tokens)", ylabel="needle depth")
        ax.set_title(f"{display(name)}, ρ={rho:g} ({model})", fontsize=10)
        fig.colorbar(image, ax=ax, label=part["primary_metric"].iloc[0])
        made.append(save(fig, out / f"needle_{model}_{name}_rho{rho:g}.png"))
    return made


def alpha_sensitivity(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """InertiaKV's EMA alpha vs score normalised to alpha=0.8, one line per (task, rho)."""
    column = "p.aggregator.alpha"
    if column not in frame.columns:
        return []
    # Only the alpha sweep: InertiaKV variants that differ from the named config in alpha alone.
    alpha_only = frame["variant"].str.match(r"^inertia(\[aggregator\.alpha=[^,]*\])?$")
    sweep = frame[(frame["method"] == "inertia") & alpha_only]
    made = []
    for model, part in sweep.groupby("model"):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        drawn = False
        for (task, rho), rows in part.groupby(["task", "rho"]):
            means = {alpha: benchmark_mean(r, "score") for alpha, r in rows.groupby(column)}
            if len(means) < 2 or not means.get(0.8):
                continue
            alphas = sorted(means)
            ax.plot(alphas, [means[a] / means[0.8] for a in alphas], marker="o", label=f"{task}, ρ={rho:g}")
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.axvline(0.8, color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="EMA α (0 = single-step)", ylabel="score / score at α=0.8")
        ax.set_title(f"α sensitivity ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"alpha_sensitivity_{model}.png"))
    return made


def throughput(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Decode tokens/s vs prompt length per method (points and the mean per length bin)."""
    rows = defaults_only(frame[(frame["task"] != "dialogs") & frame["decode_tokens_per_s"].gt(0)])
    made = []
    for model, part in rows.groupby("model"):
        if part["prefill_len"].nunique() < 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 3.8))
        # Prompts of one nominal length differ by a few tokens: average within log-spaced bins.
        bins = np.unique(np.geomspace(part["prefill_len"].min(), part["prefill_len"].max() + 1, 8).round())
        for (name, rho), r in part.groupby(["variant", "rho"]):
            binned = r.groupby(pd.cut(r["prefill_len"], bins, include_lowest=True), observed=True)
            label = display(name) if name == "full" else f"{display(name)} ρ={rho:g}"
            ax.plot(binned["prefill_len"].mean(), binned["decode_tokens_per_s"].mean(), marker="o", label=label,
                    linestyle="--" if name == "full" else "-")  # fmt: skip
        ax.set(xscale="log", xlabel="prompt length L0 (tokens)", ylabel="decode tokens / s")
        ax.set_title(f"decode throughput vs context ({model})", fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        made.append(save(fig, out / f"throughput_{model}.png"))
    return made


def decode_composition(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Mean decode time per example split into scoring, eviction (gather) and the rest."""
    rows = defaults_only(frame[(frame["task"] != "dialogs") & frame["decode_s"].gt(0)])
    made = []
    for (model, task), part in rows.groupby(["model", "task"]):
        parts = part.assign(rest=part["decode_s"] - part["score_s"] - part["evict_s"])
        means = parts.groupby(["variant", "rho"])[["score_s", "evict_s", "rest"]].mean()
        if means.empty:
            continue
        labels = [display(v) if v == "full" else f"{display(v)} ρ={r:g}" for v, r in means.index]
        fig, ax = plt.subplots(figsize=(6, 0.9 + 0.35 * len(means)))
        left = np.zeros(len(means))
        for column, name, color in (("score_s", "scoring", "tab:red"), ("evict_s", "eviction", "tab:orange"),
                                    ("rest", "model forward and rest", "tab:blue")):  # fmt: skip
            ax.barh(labels, means[column], left=left, label=name, color=color)
            left += means[column].to_numpy()
        ax.set(xlabel="decode time per example (s)")
        ax.set_title(f"decode-time composition: {task} ({model})", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        made.append(save(fig, out / f"decode_composition_{task}_{model}.png"))
    return made


def retention_panels(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Retained positions per decode step (layer 0) for the first traced example of each run."""
    traces = [(folder.name, line) for folder in sorted(root.glob("*/")) for line in kept_rasters(folder)]
    if not traces:
        return []
    traces = traces[:6]
    fig, axes = plt.subplots(1, len(traces), figsize=(3.2 * len(traces), 3.4), squeeze=False, sharey=True)
    for ax, (run, line) in zip(axes[0], traces, strict=True):
        for step, kept in enumerate(line["kept"], start=1):
            ax.scatter(kept, [step] * len(kept), s=1, color="tab:blue", marker="s")
            top = (line.get("raw_top") or [None] * len(line["kept"]))[step - 1]
            if top:
                evicted = sorted(set(top) - set(kept))
                ax.scatter(evicted, [step] * len(evicted), s=6, color="tab:red", marker="x")
        method = RunId.parse(run).method
        ax.set_title(f"{display(method)}\n{line['example_id']}", fontsize=8)
        ax.set_xlabel("position")
    axes[0][0].set_ylabel("decode step (blue: kept, red x: raw top-B evicted)", fontsize=8)
    axes[0][0].invert_yaxis()
    return [save(fig, out / "retention_panels.png")]


FIGURES: dict[str, Figure] = {
    "quality vs budget": quality_vs_budget,
    "needle heatmap": needle_heatmap,
    "alpha sensitivity": alpha_sensitivity,
    "decode throughput": throughput,
    "decode-time composition": decode_composition,
    "retention panels": retention_panels,
}
