"""KVpop's figures (arXiv 2607.05061): efficiency (Fig. 4), delayed scoring (Fig. 5), eviction patterns
(Figs. 6 and 9), the teacher recall per layer and head (Fig. 7) and DMS's sparsity against KVpop's (App. H).

Fig. 4 reads the runs its preset timed (``kvpop_fig4``'s seed); Figs. 6, 7, 9 and
App. H the traced runs of ``kvpop_fig7`` (``method.pattern_tail``, ``method.recall_queries``).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.figures.common import Figure, save  # noqa: E402
from harness.analysis.papers.kvpop import POINTS, row_variant  # noqa: E402
from harness.analysis.results import one_batch_size  # noqa: E402
from harness.analysis.spec import restrict  # noqa: E402
from harness.analysis.variants import display  # noqa: E402
from harness.config import experiment_preset  # noqa: E402
from harness.record.files import read_records  # noqa: E402

RECALL = re.compile(r"meta\.recall_l(\d+)_h(\d+)")
#: Fig. 4's methods: dense attention, DMS and KVpop, at CR = 75% (the paper's).
EFFICIENCY = ("dms", "kvpop")
FIG4_POINT = "75%"


def kvpop_retention_maps(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 7: top-k recall against the full-attention teacher per layer and KV head (``method.recall_queries``)."""
    columns = {c: tuple(int(x) for x in m.groups()) for c in frame.columns if (m := RECALL.fullmatch(c))}
    if not columns:
        return []
    made = []
    measured = frame[frame[next(iter(columns))].notna()]
    for (model, name, rho), part in measured.groupby(["model", "variant", "rho"]):
        layers = max(layer for layer, _ in columns.values()) + 1
        heads = max(head for _, head in columns.values()) + 1
        grid = np.full((layers, heads), np.nan)
        for column, (layer, head) in columns.items():
            grid[layer, head] = part[column].mean()
        fig, ax = plt.subplots(figsize=(1.5 + 0.3 * heads, 1.5 + 0.2 * layers))
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set(xlabel="KV head", ylabel="layer", title=f"{display(name)} recall vs teacher ({model}, ρ={rho:g})")
        fig.colorbar(image, ax=ax)
        made.append(save(fig, out / f"kvpop_recall_{model}_{name}_rho{rho:g}.png"))
    return made


def kvpop_efficiency(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 4: decoding latency and peak memory against the generation length, dense vs DMS vs KVpop.

    ``frame`` holds the runs of ``kvpop_fig4`` (its seed), at whatever generation limits it swept; of
    those, its task's: the teacher, and DMS and KVpop at CR = 75%'s budgets.
    """
    tasks = str(experiment_preset("kvpop_fig4.yaml")["hydra"]["sweeper"]["params"]["task"]).split(",")
    rho, budgets = POINTS[FIG4_POINT]
    rows = [{"variant": "full"}, *({"variant": [row_variant(m, b) for b in budgets], "rho": rho} for m in EFFICIENCY)]
    part = pd.concat([restrict(frame, {"task": tasks, **row}) for row in rows])
    part = part[part["new_tokens"].notna()]
    if part.empty or part["new_tokens"].nunique() < 2:
        return []
    one_batch_size(part, "KVpop Figure 4")
    made = []
    for model, runs in part.groupby("model"):
        fig, (latency, memory) = plt.subplots(1, 2, figsize=(9, 3.5))
        for name, rows_of in runs.groupby("method"):
            points = rows_of.groupby("new_tokens")[["decode_s", "decode_peak_bytes"]].mean()
            latency.plot(points.index, points["decode_s"], marker="o", label=display(name))
            memory.plot(points.index, points["decode_peak_bytes"] / 2**20, marker="o", label=display(name))
        latency.set(xlabel="generated tokens", ylabel="decode latency (s)", title=f"(a) latency ({model})")
        memory.set(xlabel="generated tokens", ylabel="decode peak (MiB)", title="(b) peak memory")
        latency.legend()
        made.append(save(fig, out / f"kvpop_efficiency_{model}.png"))
    return made


def training_histories(root: Path) -> list[dict]:
    """The ``training.json`` of every trained row under ``<root>/kvpop/<model>/<row>_B<budget>/``."""
    return [json.loads(path.read_text()) for path in sorted((root / "kvpop").glob("*/*/training.json"))]


def kvpop_delayed_scoring(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Fig. 5: held-out token accuracy over training, mLSTM with delayed readout (kvpop) vs immediate."""
    runs: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for summary in training_histories(root):
        config = summary["config"]
        if config["name"] in ("kvpop", "kvpop_immediate"):
            key = (config["model"]["name"], config["kvpop"]["budget"])
            runs.setdefault(key, {})[config["name"]] = summary["history"]
    made = []
    for (model, budget), rows in sorted(runs.items()):
        if len(rows) < 2:
            continue
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        for name, history in sorted(rows.items()):
            ax.plot(
                [p["step"] for p in history], [p["token_accuracy"] for p in history], marker=".", label=display(name)
            )
        ax.set(xlabel="training step", ylabel="token accuracy", title=f"delayed scoring ({model}, B={budget})")
        ax.legend()
        made.append(save(fig, out / f"kvpop_delayed_{model}_B{budget}.png"))
    return made


def _patterns(frame: pd.DataFrame, root: Path) -> dict[str, dict]:
    """The first traced record (``meta.pattern_heads``) of every run of ``frame``, by run id."""
    found = {}
    for run_id in sorted(frame["run_id"].unique()):
        path = root / run_id / "records.jsonl"
        record = next((r for r in read_records(path) if "pattern_heads" in (r.get("meta") or {})), None)
        if record is not None:
            found[run_id] = record
    return found


def kvpop_eviction_patterns(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figs. 6 and 9: for the last evictable positions (the paper's 112), how many KV heads of each layer keep
    them at the end (``method.pattern_tail``), with the positions' tokens; the first such record of each run."""
    made = []
    for run_id, record in _patterns(frame, root).items():
        heads = np.array(record["meta"]["pattern_heads"], dtype=float)
        tokens = record["meta"].get("pattern_tokens") or [str(p) for p in record["meta"]["pattern_positions"]]
        fig, ax = plt.subplots(figsize=(2 + 0.25 * heads.shape[1], 1.5 + 0.18 * heads.shape[0]))
        image = ax.imshow(heads, cmap="magma", aspect="auto", vmin=0)
        ax.set_xticks(range(len(tokens)), [t.replace("$", r"\$") for t in tokens], rotation=90, fontsize=6)
        ax.set(ylabel="layer", title=f"{display(record['method'])}: KV heads keeping each token ({record['model']})")
        fig.colorbar(image, ax=ax, label="KV heads")
        made.append(save(fig, out / f"kvpop_pattern_{run_id}.png"))
    return made


def dms_sparsity(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """App. H: where DMS keeps its long-range entries, beside KVpop at the same model and CR.

    The paper finds DMS's gates concentrate long-range capacity in a few heads. From the traced runs:
    (a) per layer, the share of the last evictable tokens (``pattern_tail``) that no KV head keeps, and
    that every head keeps (capacity spread thin or doubled up); (b) every (layer, KV head)'s recall of the
    teacher's top-k (``recall_queries``), heads sorted high to low: a steep curve is capacity held by few
    heads. Our DMS holds a fixed budget per head (``methods.dms``), so its heads cannot differ in size as
    DMS's own threshold rule lets them; what differs is which tokens they keep.
    """
    columns = [c for c in frame.columns if RECALL.fullmatch(c)]
    kv_heads = 1 + max((int(RECALL.fullmatch(c)[2]) for c in columns), default=0)
    rows = frame[frame["method"].isin(["dms", "kvpop"])]
    patterns = _patterns(rows, root)
    # Table 1's untraced runs share the preset's seed: only the traced ones are chosen, whatever the row order.
    traced = rows[rows["run_id"].isin(patterns)]
    made = []
    for (model, rho), part in traced.groupby(["model", "rho"]):
        runs = part.groupby("method")["run_id"].first().to_dict()
        if "dms" not in runs:
            continue
        fig, (coverage, recall) = plt.subplots(1, 2, figsize=(9, 3.5))
        for name, run_id in sorted(runs.items()):
            heads = np.array(patterns[run_id]["meta"]["pattern_heads"], dtype=float)
            layers = np.arange(heads.shape[0])
            (line,) = coverage.plot(layers, (heads == 0).mean(axis=1), marker="o", label=f"{display(name)}: no head")
            coverage.plot(layers, (heads >= max(kv_heads, 1)).mean(axis=1), marker="s", linestyle="--",
                          color=line.get_color(), label=f"{display(name)}: every head")  # fmt: skip
            values = part.loc[part["run_id"] == run_id, columns].mean().dropna().sort_values(ascending=False)
            if not values.empty:
                ranks = np.arange(1, len(values) + 1)
                recall.plot(ranks, values.to_numpy(), color=line.get_color(), label=display(name))
        coverage.set(xlabel="layer", ylabel="share of the tail's tokens", title=f"(a) tail coverage ({model})")
        recall.set(xlabel="(layer, KV head), sorted", ylabel="teacher top-k recall", title=f"(b) recall, ρ={rho:g}")
        coverage.legend(fontsize=7)
        recall.legend(fontsize=7)
        made.append(save(fig, out / f"kvpop_apph_dms_{model}_rho{rho:g}.png"))
    return made


FIGURES: dict[str, Figure] = {
    "KVpop Fig. 4 efficiency": Figure(kvpop_efficiency, "kvpop_fig4"),
    "KVpop Fig. 5 delayed scoring": Figure(kvpop_delayed_scoring, None),
    "KVpop Figs. 6/9 eviction patterns": Figure(kvpop_eviction_patterns, "kvpop_fig7"),
    "KVpop Fig. 7 recall per layer and head": Figure(kvpop_retention_maps, "kvpop_fig7"),
    "KVpop App. H DMS sparsity": Figure(dms_sparsity, "kvpop_fig7"),
}
