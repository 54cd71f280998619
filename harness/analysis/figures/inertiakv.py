"""InertiaKV's figures (arXiv 2609.03515), each from the records of the preset that fills it.

Figure 1: retention panels (per-step vs EMA, three scorers); 2: scorer deviations and lazy-
refresh quality; 3: decode-time composition; 4: the two-token illustration of EMA against boundary
flips; 5: quality vs KV budget; 6: quality vs retained tokens and vs decode throughput; 7: the
auxiliary variant's gap; 8: the needle heatmap; 9: alpha sensitivity; 10: Lazy-r decode speed-up;
11: decode throughput across context lengths. A figure's curves are drawn over the examples all of
its configurations recorded (``harness.analysis.shared``), as a table's cells are; the timing figures
(3, 10, 11) read only the efficiency preset's runs, timed for them (``harness.analysis.presets``).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import itertools  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from harness.analysis.diagnostics import traced_lines  # noqa: E402
from harness.analysis.figures.common import Figure, save  # noqa: E402
from harness.analysis.papers.inertiakv import (  # noqa: E402
    ALPHAS,
    BENCHMARKS,
    REFRESH,
    RHOS,
    SCORERS,
    alpha,
    benchmark_where,
    diag,
)
from harness.analysis.presets import preset_lengths  # noqa: E402
from harness.analysis.results import one_batch_size  # noqa: E402
from harness.analysis.shared import among  # noqa: E402
from harness.analysis.spec import benchmark_mean, one_per_example, restrict  # noqa: E402
from harness.analysis.variants import display  # noqa: E402
from methods.aggregators.ema import EMA  # noqa: E402
from methods.overlap import jaccard  # noqa: E402

BUDGET_METHODS = ("tova", "snapkv", "adakv_ea", "keydiff", "inertia")
NEEDLE_METHODS = ("full", "tova", "snapkv", "adakv_ea", "kvzip_mask", "keydiff", "inertia", "inertia_lazy")
COST_METHODS = ("tova", "snapkv", "adakv_ea", "kvzip_mask", "keydiff", "inertia", "inertia_lazy")
SPEED = {
    "Lazy-2": REFRESH["Lazy-2"],
    "Lazy-4": REFRESH["Lazy-4"],
    "Lazy-8": REFRESH["Lazy-8"],
    "Score-Free": "score_free",
}


def _mean(frame: pd.DataFrame, where: Mapping[str, Any], metric: str = "score") -> float:
    return benchmark_mean(one_per_example(restrict(frame, where)), metric)


def _panels(frame: pd.DataFrame) -> list[tuple[str, dict[str, Any]]]:
    """One panel per benchmark recorded; RULER one per benchmark length (averaging 4k and 16k hides the drop)."""
    out = []
    for task, label in BENCHMARKS.items():
        where = benchmark_where(task)
        found = restrict(frame, where)
        if found.empty:
            continue
        if task == "ruler":
            out += [(f"RULER {int(n)}", {**where, "meta.length": n}) for n in sorted(found["meta.length"].unique())]
        else:
            out.append((label, where))
    return out


def _grid(count: int, width: float = 4.2, height: float = 3.4) -> tuple[plt.Figure, np.ndarray]:
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, axes[0]


def _unit(where: Mapping[str, Any]) -> str:
    return "accuracy (0-1)" if where.get("task") == "longbench_v2" else "score (0-100)"


# --------------------------------------------------------------------------- Figure 1
def retention_panels(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 1: retained prompt tokens per decode step, per-step (single-step) vs EMA, for three scorers.

    Columns are the prompt tokens sorted by the reference utility (the EMA-attention run's
    attention over the whole prompt at the first decode step, high to low); navy cells are
    retained; the dashed line is the budget. Titles give the mean pairwise Jaccard of the three
    scorers' retained sets over the steps of the shown example.
    """
    scorers = {"attention": None, "VNorm": "vnorm", "entropy": "entropy"}
    labels = {
        (aggregation, name): diag(method, None if scorer is None else {"scorer": scorer})
        for aggregation, method in (("per-step", "single_step"), ("EMA", "inertia"))
        for name, scorer in scorers.items()
    }
    made = []
    for model, part in frame[frame["variant"].isin(set(labels.values()))].groupby("model"):
        lines = {}
        for key, label in labels.items():
            # Every run of the variant (Figure 1's and other presets' traced runs), by example id.
            runs = part.loc[part["variant"] == label, "run_id"].unique()
            if len(runs):
                lines[key] = {example: line for run in runs for example, line in traced_lines(root / run).items()}
        reference = lines.get(("EMA", "attention"), {})
        common = set(reference)
        for traced in lines.values():
            common &= set(traced)
        if not common or len(lines) < 2:
            continue
        example = sorted(common)[0]
        first = reference[example].get("first_scores") or {}
        order = [p for _, p in sorted(zip(first.get("raw", []), first.get("positions", []), strict=True), reverse=True)]
        if not order:
            continue
        column = {p: i for i, p in enumerate(order)}
        fig, axes = plt.subplots(2, 3, figsize=(12, 6), squeeze=False)
        for row, aggregation in enumerate(("per-step", "EMA")):
            sets = [lines[(aggregation, n)][example]["kept"] for n in scorers if (aggregation, n) in lines]
            overlap = _pairwise_jaccard(sets)
            for col, name in enumerate(scorers):
                ax = axes[row][col]
                line = lines.get((aggregation, name), {}).get(example)
                if line is None:
                    ax.axis("off")
                    continue
                image = np.zeros((len(line["kept"]), len(order)))
                for step, kept in enumerate(line["kept"]):
                    image[step, [column[p] for p in kept if p in column]] = 1
                ax.imshow(image, cmap="Blues", aspect="auto", interpolation="nearest", vmin=0, vmax=1)
                ax.axvline(line["budget"] - 0.5, color="black", linestyle="--", linewidth=1)
                ax.set_title(f"{name}, {aggregation}", fontsize=9)
                ax.set(xlabel="prompt tokens by reference utility (high → low)", ylabel="decode step")
            axes[row][0].annotate(
                f"{aggregation}: mean pairwise Jaccard {overlap:.2f}", (0, 1.18), xycoords="axes fraction", fontsize=9
            )
        fig.suptitle(f"Retained tokens per decode step ({model}, {example})", fontsize=10)
        made.append(save(fig, out / f"inertia_fig1_retention_{model}.png"))
    return made


def _pairwise_jaccard(runs: Sequence[Sequence[Sequence[int]]]) -> float:
    values = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            # Steps where neither run kept anything say nothing about their overlap.
            values += [jaccard(x, y) for x, y in zip(a, b, strict=False) if len(x) or len(y)]
    return float(np.mean(values)) if values else float("nan")


# --------------------------------------------------------------------------- Figure 2
def _paired_delta(frame: pd.DataFrame, where: Mapping[str, Any], base: str, other: str) -> float:
    a = one_per_example(restrict(frame, {**where, "variant": base}))
    b = one_per_example(restrict(frame, {**where, "variant": other}))
    keys = ["model", "task", "subtask", "seed", "example_id"]
    shared = a.merge(b[[*keys, "score"]], on=keys, suffixes=("", "_b"))
    if shared.empty:
        return float("nan")
    return benchmark_mean(shared.assign(score=shared["score_b"]), "score") - benchmark_mean(shared, "score")


def scorer_deviations(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 2(a): each scorer's deviation from EMA over attention, per benchmark (Sec. 5.1's runs)."""
    base = SCORERS["attention (InertiaKV)"]
    others = {label: name for label, name in SCORERS.items() if name != base}
    made = []
    for model, part in frame[frame["variant"].isin(set(SCORERS.values())) & (frame["rho"] == 0.9)].groupby("model"):
        part = among(part, [{"variant": name} for name in SCORERS.values()])
        panels = [(label, where) for label, where in _panels(part) if not label.startswith("RULER ")]
        panels += [("RULER", benchmark_where("ruler"))] if not restrict(part, benchmark_where("ruler")).empty else []
        rows = {
            label: [_paired_delta(part, where, base, name) for _, where in panels] for label, name in others.items()
        }
        rows = {label: deltas for label, deltas in rows.items() if not all(np.isnan(deltas))}
        if not rows or not panels:
            continue
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(rows) * len(panels) / 2, 3.6))
        width = 0.8 / len(panels)
        for index, (label, _) in enumerate(panels):
            ax.bar(
                np.arange(len(rows)) + index * width,
                [deltas[index] for deltas in rows.values()],
                width,
                label=label,
            )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(rows)) + width * (len(panels) - 1) / 2, list(rows), rotation=30, ha="right")
        ax.set(ylabel="Δ vs EMA over attention (points)")
        ax.set_title(f"Scorer deviations under EMA at 90% ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"inertia_fig2a_scorers_{model}.png"))
    return made


def lazy_quality(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 2(b): quality change vs full refresh as scores refresh every r steps (Score-Free: once)."""
    intervals = {"Lazy-2": 2, "Lazy-4": 4, "Lazy-8": 8, "Lazy-16": 16}
    made = []
    for model, part in frame[frame["variant"].isin(set(REFRESH.values())) & (frame["rho"] == 0.9)].groupby("model"):
        part = among(part, [{"variant": name} for name in REFRESH.values()])
        panels = _panels(part)
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        drawn = False
        for label, where in panels:
            points = [(1, 0.0)] + [
                (r, _paired_delta(part, where, "inertia", REFRESH[name])) for name, r in intervals.items()
            ]
            free = _paired_delta(part, where, "inertia", "score_free")
            points = [(r, d) for r, d in points if not np.isnan(d)]
            if len(points) < 2 and np.isnan(free):
                continue
            drawn = True
            (line,) = ax.plot([r for r, _ in points], [d for _, d in points], marker="o", label=label)
            if not np.isnan(free):
                ax.scatter([32], [free], marker="*", s=90, color=line.get_color())
        if not drawn:
            plt.close(fig)
            continue
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16, 32], ["1 (full)", "2", "4", "8", "16", "Score-Free"])
        ax.set(xlabel="refresh interval r", ylabel="Δ vs full refresh (points)")
        ax.set_title(f"Lazy refresh at 90% ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"inertia_fig2b_lazy_{model}.png"))
    return made


# --------------------------------------------------------------------------- Figures 3, 10, 11
def _efficiency(frame: pd.DataFrame, profiled: bool = False) -> pd.DataFrame:
    """The timed runs: ``frame`` holds the efficiency preset's (its seed), at whatever lengths it swept.

    ``profiled``: the runs that timed the method apart (``profile=true``, which Figure 3 splits; their
    steps ran eagerly with a clock around the method), else the plain runs (the throughput figures).
    """
    rows = restrict(frame, {"task": "ruler", "subtask": "niah_single_1"})
    rows = rows[rows["score_s"].notna() == profiled] if "score_s" in rows.columns else rows.iloc[0:0]
    return one_batch_size(rows[(rows["variant"] == "full") | (rows["rho"] == 0.9)], "InertiaKV Figures 3, 10 and 11")


def decode_composition(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 3: decode time split into score updates, eviction and the rest, at the shortest efficiency length."""
    shown = {"Full Refresh": "inertia", "Lazy-4": REFRESH["Lazy-4"], "Score-Free": "score_free"}
    made = []
    for model, part in _efficiency(frame, profiled=True).groupby("model"):
        part = among(part[part["variant"].isin(set(shown.values()))], [{"variant": n} for n in shown.values()])
        if part.empty:
            continue
        length = int(part["meta.length"].min())
        at = part[part["meta.length"] == length]
        fig, ax = plt.subplots(figsize=(6.5, 2.8))
        labels = [label for label, name in shown.items() if (at["variant"] == name).any()]
        for row, label in enumerate(labels):
            runs = at[at["variant"] == shown[label]]
            total = runs["decode_s"].mean()
            score_share, evict_share = runs["score_s"].mean() / total, runs["evict_s"].mean() / total
            ax.barh(row, score_share, color="tab:red", label="score updates" if row == 0 else None)
            ax.barh(row, evict_share, left=score_share, color="tab:orange", label="eviction" if row == 0 else None)
            ax.barh(row, 1 - score_share - evict_share, left=score_share + evict_share, color="tab:blue",
                    label="model forward and rest" if row == 0 else None)  # fmt: skip
            ax.text(0.01, row, f"{100 * score_share:.0f}%", va="center", color="white", fontsize=8)
        ax.set_yticks(range(len(labels)), labels)
        ax.set(xlabel="share of decode time", xlim=(0, 1))
        ax.set_title(f"Decode-time composition at {length} tokens, 90% ({model})", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        made.append(save(fig, out / f"inertia_fig3_composition_{model}.png"))
    return made


def lazy_speedup(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 10: decode tokens/s of Lazy-r over full refresh at the longest efficiency length."""
    made = []
    for model, part in _efficiency(frame).groupby("model"):
        part = among(part, [{"variant": name} for name in ("inertia", *SPEED.values())])
        length = part["meta.length"].max()
        at = part[part["meta.length"] == length]
        full = at.loc[at["variant"] == "inertia", "decode_tokens_per_s"].mean()
        speed = {
            label: at.loc[at["variant"] == name, "decode_tokens_per_s"].mean() / full for label, name in SPEED.items()
        }
        speed = {label: value for label, value in speed.items() if not np.isnan(value)}
        if np.isnan(full) or not speed:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.4))
        bars = ax.bar(list(speed), list(speed.values()), color="tab:blue")
        ax.bar_label(bars, [f"{v:.2f}×" for v in speed.values()], fontsize=8)
        ax.axhline(1, color="black", linestyle="--", linewidth=1)
        ax.set(ylabel="decode speed-up over full refresh")
        ax.set_title(f"Lazy refresh speed-up at {int(length)} tokens, 90% ({model})", fontsize=10)
        made.append(save(fig, out / f"inertia_fig10_speedup_{model}.png"))
    return made


def throughput_scaling(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 11: decode tokens/s of the full cache, full refresh and Lazy-4 per context length."""
    shown = {"Full Cache": "full", "Full Refresh": "inertia", "InertiaKV-Lazy4": REFRESH["Lazy-4"]}
    made = []
    for model, part in _efficiency(frame).groupby("model"):
        part = among(part, [{"variant": name} for name in shown.values()])
        lengths = sorted(int(n) for n in part["meta.length"].unique())
        means = {
            label: [part.loc[(part["variant"] == name) & (part["meta.length"] == n), "decode_tokens_per_s"].mean()
                    for n in lengths]
            for label, name in shown.items()
        }  # fmt: skip
        if all(np.isnan(v).all() for v in means.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6))
        width = 0.27
        for index, (label, values) in enumerate(means.items()):
            ax.bar(np.arange(len(lengths)) + index * width, values, width, label=label)
        for i, (refresh, lazy) in enumerate(zip(means["Full Refresh"], means["InertiaKV-Lazy4"], strict=True)):
            if refresh and not np.isnan(refresh) and not np.isnan(lazy):
                ax.annotate(f"{lazy / refresh:.2f}×", (i + 2 * width, lazy), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(np.arange(len(lengths)) + width, [f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths])
        ax.set(xlabel="context length", ylabel="decode tokens / s")
        ax.set_title(f"Decode throughput at 90% ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"inertia_fig11_throughput_{model}.png"))
    return made


# --------------------------------------------------------------------------- Figure 4
#: Figure 4's two tokens near the rank-B boundary, 16 decode steps: A is the more useful over the
#: whole generation, yet its raw per-step score falls below B's on 5 of the 16 steps (the paper's count).
BOUNDARY_PAIR = {
    "A": (0.60, 0.47, 0.58, 0.60, 0.46, 0.57, 0.59, 0.48, 0.58, 0.61, 0.57, 0.45, 0.59, 0.58, 0.49, 0.60),
    "B": (0.50, 0.53, 0.51, 0.52, 0.54, 0.50, 0.52, 0.55, 0.51, 0.50, 0.52, 0.53, 0.50, 0.51, 0.55, 0.52),
}


def boundary_flips(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 4: two tokens near the boundary, raw per-step scores (a) against InertiaKV's EMA at 0.8 (b).

    The paper's figure is an illustration, not a measurement (App. I's rank traces, Table 13, are the
    measurement); it is drawn from ``BOUNDARY_PAIR`` through the aggregator the method runs
    (``methods.aggregators.ema.EMA``, state 0 before the first step), and each panel counts the steps
    on which B outranks A, i.e. where A would be the one evicted at a one-slot boundary.
    """
    raw = torch.tensor([BOUNDARY_PAIR["A"], BOUNDARY_PAIR["B"]], dtype=torch.float64)
    ema, state, smoothed = EMA(alpha=0.8), torch.zeros(2, dtype=torch.float64), []
    for step in raw.T:
        state = ema.combine(state, step)
        smoothed.append(state)
    series = {"(a) raw per-step score": raw, "(b) EMA, α=0.8": torch.stack(smoothed, dim=1)}
    fig, axes = _grid(2, 4.6, 3.2)
    steps = np.arange(1, raw.shape[1] + 1)
    for ax, (title, values) in zip(axes, series.items(), strict=True):
        flips = values[0] < values[1]
        for row, name, colour in ((0, "token A", "tab:blue"), (1, "token B", "tab:orange")):
            ax.plot(steps, values[row].numpy(), marker="o", markersize=3, color=colour, label=name)
        for step in steps[flips.numpy()]:
            ax.axvspan(step - 0.5, step + 0.5, color="tab:red", alpha=0.15, linewidth=0)
        ax.set(xlabel="decode step", ylabel="score")
        ax.set_title(f"{title}: B above A on {int(flips.sum())} of {len(steps)} steps", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Two tokens near the rank-B boundary (shaded: A would be evicted)", fontsize=10)
    return [save(fig, out / "inertia_fig4_boundary_flips.png")]


# --------------------------------------------------------------------------- Figures 5, 6, 7, 9
def quality_vs_budget(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 5: quality vs compression ratio per benchmark, one line per method, the full cache dashed."""
    made = []
    for model, part in frame[frame["variant"].isin({*BUDGET_METHODS, "full"})].groupby("model"):
        if part.loc[part["variant"] != "full", "rho"].nunique() < 2:
            continue
        part = among(part, [{"variant": "full"}, *({"variant": n, "rho": r} for n in BUDGET_METHODS for r in RHOS)])
        panels = _panels(part)
        if not panels:
            continue
        fig, axes = _grid(len(panels))
        for ax, (label, where) in zip(axes, panels, strict=True):
            for name in BUDGET_METHODS:
                curve = [(rho, _mean(part, {**where, "variant": name, "rho": rho})) for rho in RHOS]
                curve = [(r, v) for r, v in curve if not np.isnan(v)]
                if curve:
                    ax.plot([100 * r for r, _ in curve], [v for _, v in curve], marker="o", label=display(name))
            full = _mean(part, {**where, "variant": "full"})
            if not np.isnan(full):
                ax.axhline(full, color="black", linestyle="--", linewidth=1, label="Full cache")
            ax.set(xlabel="compression ratio ρ (%)", ylabel=_unit(where))
            ax.set_title(label, fontsize=10)
            ax.legend(fontsize=7)
        fig.suptitle(f"Quality vs KV budget ({model})", fontsize=10)
        made.append(save(fig, out / f"inertia_fig5_budget_{model}.png"))
    return made


def quality_vs_cost(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 6: RULER vs retained decode-side tokens across ratios (a) and vs decode throughput at 90% (b)."""
    where = {"task": "ruler", "meta.length": preset_lengths("inertia_fig6.yaml")}
    rows = restrict(frame, where)
    made = []
    rows = one_batch_size(rows[rows["variant"].isin({*COST_METHODS, "full"})], "InertiaKV Figure 6's throughput panel")
    for model, part in rows.groupby("model"):
        part = among(part, [{"variant": "full"}, *({"variant": n, "rho": r} for n in COST_METHODS for r in RHOS)])
        fig, (left, right) = _grid(2, 5.0, 3.8)
        drawn = False
        markers = itertools.cycle("os^DvP*X")
        for name in (*COST_METHODS, "full"):
            runs = part[part["variant"] == name]
            if runs.empty:
                continue
            drawn = True
            points = sorted(
                (r["kv_entries_held"].mean(), benchmark_mean(one_per_example(r), "score"))
                for _, r in runs.groupby("rho")
            )
            (line,) = left.plot([p for p, _ in points], [s for _, s in points], marker="o", label=display(name))
            at90 = runs if name == "full" else runs[runs["rho"] == 0.9]
            if not at90.empty:
                # A legend, not text beside each point: methods of one family land on top of each other.
                x, y = at90["decode_tokens_per_s"].mean(), benchmark_mean(one_per_example(at90), "score")
                right.scatter([x], [y], color=line.get_color(), marker=next(markers), label=display(name))
        if not drawn:
            plt.close(fig)
            continue
        left.set(xscale="log", xlabel="retained decode-side KV tokens", ylabel="RULER (0-100)")
        # Within a decade or two the default log axis labels every minor tick, and they collide.
        left.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        left.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        left.xaxis.set_minor_formatter(ticker.NullFormatter())
        left.set_title("(a) quality vs retained tokens, 50/75/90%", fontsize=9)
        left.legend(fontsize=7)
        right.set(xlabel="decode tokens / s", ylabel="RULER (0-100)")
        right.set_title("(b) quality vs decode throughput, 90%", fontsize=9)
        right.legend(fontsize=7)
        lengths = ", ".join(str(int(n)) for n in sorted(part["meta.length"].unique()))
        fig.suptitle(f"Quality-cost trade-offs on RULER at {lengths} tokens ({model})", fontsize=10)
        made.append(save(fig, out / f"inertia_fig6_cost_{model}.png"))
    return made


def auxiliary_gap(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 7: InertiaKV minus the auxiliary variant per compression ratio and benchmark."""
    made = []
    for model, part in frame[frame["variant"].isin({"inertia", "inertia_aux"})].groupby("model"):
        if part.loc[part["variant"] == "inertia_aux", "rho"].nunique() < 2:
            continue
        part = among(part, [{"variant": n, "rho": r} for n in ("inertia", "inertia_aux") for r in RHOS])
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for label, where in _panels(part):
            gaps = [(r, _paired_delta(part, {**where, "rho": r}, "inertia_aux", "inertia")) for r in RHOS]
            gaps = [(r, g) for r, g in gaps if not np.isnan(g)]
            if gaps:
                ax.plot([100 * r for r, _ in gaps], [g for _, g in gaps], marker="o", label=label)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel="compression ratio ρ (%)", ylabel="InertiaKV − auxiliary (points)")
        ax.set_title(f"Auxiliary-variant gap vs compression ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"inertia_fig7_auxiliary_{model}.png"))
    return made


def alpha_sensitivity(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 9: each benchmark's score over alpha, normalised by its best alpha; dashed: the default 0.8."""
    labels = {a: alpha(a) for a in ALPHAS}
    made = []
    for model, part in frame[frame["variant"].isin(set(labels.values())) & (frame["rho"] == 0.9)].groupby("model"):
        part = among(part, [{"variant": name} for name in labels.values()])
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        drawn = False
        for label, where in _panels(part):
            curve = [(a, _mean(part, {**where, "variant": name})) for a, name in labels.items()]
            curve = [(a, v) for a, v in curve if not np.isnan(v)]
            best = max((v for _, v in curve), default=0.0)
            if len(curve) < 2:
                continue
            drawn = True
            # A benchmark scoring 0 at every alpha has no best to normalise by: drawn at 0, so labelled.
            scale, label = (best, label) if best > 0 else (1.0, f"{label} (0 at every α)")
            ax.plot([a for a, _ in curve], [v / scale for _, v in curve], marker="o", label=label)
        if not drawn:
            plt.close(fig)
            continue
        ax.axvline(0.8, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="EMA α (0 = single-step)", ylabel="score / best score over α")
        ax.set_title(f"α sensitivity at 90% ({model})", fontsize=10)
        ax.legend(fontsize=8)
        made.append(save(fig, out / f"inertia_fig9_alpha_{model}.png"))
    return made


# --------------------------------------------------------------------------- Figure 8
def needle_heatmap(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figure 8: ROUGE-L F over context length x depth, the full cache and the methods at 90%."""
    needle = frame[(frame["task"] == "needle") & frame["variant"].isin(NEEDLE_METHODS)]
    if needle.empty or "meta.depth" not in needle.columns:
        return []
    made = []
    for model, part in needle.groupby("model"):
        part = part[(part["rho"] == 0.9) | (part["variant"] == "full")]
        shown = [n for n in NEEDLE_METHODS if (part["variant"] == n).any()]
        part = among(part, [{"variant": n} for n in shown])
        fig, axes = plt.subplots(2, (len(shown) + 1) // 2, figsize=(3.4 * ((len(shown) + 1) // 2), 5.6), squeeze=False)
        for ax in axes.ravel()[len(shown) :]:
            ax.axis("off")
        for ax, name in zip(axes.ravel(), shown, strict=False):
            runs = part[part["variant"] == name]
            grid = runs.pivot_table(index="meta.depth", columns="meta.length", values="score", aggfunc="mean")
            image = ax.imshow(grid.to_numpy(), cmap="RdYlGn", vmin=0, vmax=100 if grid.max().max() > 1 else 1,
                              aspect="auto")  # fmt: skip
            ax.set_xticks(range(grid.shape[1]), [f"{int(c) // 1000}k" if c >= 1000 else str(c) for c in grid.columns])
            ax.set_yticks(range(grid.shape[0]), [f"{d:g}%" for d in grid.index])
            ax.set_title(display(name), fontsize=9)
            # One scale per panel: a colorbar shared across the grid collides with tight_layout.
            fig.colorbar(image, ax=ax, fraction=0.08, label="ROUGE-L F")
        fig.suptitle(f"Needle in a haystack at 90% ({model}; x: context length, y: depth)", fontsize=10)
        made.append(save(fig, out / f"inertia_fig8_needle_{model}.png"))
    return made


FIGURES: dict[str, Figure] = {
    "InertiaKV Figure 1 (retention panels)": Figure(retention_panels, "inertia_fig1"),
    "InertiaKV Figure 2a (scorer deviations)": Figure(scorer_deviations, "inertia_scorers"),
    "InertiaKV Figure 2b (lazy refresh)": Figure(lazy_quality, "inertia_table14"),
    "InertiaKV Figure 3 (decode-time composition)": Figure(decode_composition, "inertia_efficiency"),
    "InertiaKV Figure 4 (boundary flips)": Figure(boundary_flips, None),
    "InertiaKV Figure 5 (quality vs budget)": Figure(quality_vs_budget, "inertia_table1"),
    "InertiaKV Figure 6 (quality vs cost)": Figure(quality_vs_cost, "inertia_fig6"),
    "InertiaKV Figure 7 (auxiliary gap)": Figure(auxiliary_gap, "inertia_table6"),
    "InertiaKV Figure 8 (needle heatmap)": Figure(needle_heatmap, "inertia_needle"),
    "InertiaKV Figure 9 (alpha sensitivity)": Figure(alpha_sensitivity, "inertia_table5"),
    "InertiaKV Figure 10 (lazy speed-up)": Figure(lazy_speedup, "inertia_efficiency"),
    "InertiaKV Figure 11 (throughput scaling)": Figure(throughput_scaling, "inertia_efficiency"),
}
