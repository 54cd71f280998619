"""KVpop's figures (arXiv 2607.05061): efficiency (Fig. 4), delayed scoring (Fig. 5), eviction patterns
(Figs. 6 and 9) and the teacher recall per layer and head (Fig. 7)."""

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
from harness.analysis.results import one_batch_size, run_folders  # noqa: E402
from harness.analysis.variants import display  # noqa: E402
from harness.config import experiment_preset  # noqa: E402
from harness.record.files import read_records  # noqa: E402

RECALL = re.compile(r"meta\.recall_l(\d+)_h(\d+)")
#: Fig. 4's methods: dense attention, DMS and KVpop.
EFFICIENCY = ("full", "dms", "kvpop")


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
    """Fig. 4: decoding latency and peak memory against the generation length, dense vs DMS vs KVpop."""
    # The preset's tasks only: the full cache runs in every other preset too.
    tasks = str(experiment_preset("kvpop_fig4.yaml")["hydra"]["sweeper"]["params"]["task"]).split(",")
    part = frame[frame["method"].isin(EFFICIENCY) & frame["task"].isin(tasks) & frame["new_tokens"].notna()]
    if part.empty or part["new_tokens"].nunique() < 2:
        return []
    one_batch_size(part, "KVpop Figure 4")
    made = []
    for model, runs in part.groupby("model"):
        fig, (latency, memory) = plt.subplots(1, 2, figsize=(9, 3.5))
        for name, rows in runs.groupby("variant"):
            points = rows.groupby("new_tokens")[["decode_s", "decode_peak_bytes"]].mean()
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


def kvpop_eviction_patterns(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """Figs. 6 and 9: for the last evictable positions, how many KV heads of each layer keep them at the end
    (``method.pattern_tail``), with the positions' tokens; the first such record of each run."""
    made = []
    for folder in run_folders(root):
        path = folder / "records.jsonl"
        if not path.is_file():
            continue
        record = next((r for r in read_records(path) if "pattern_heads" in r["meta"]), None)
        if record is None:
            continue
        heads = np.array(record["meta"]["pattern_heads"], dtype=float)
        tokens = record["meta"].get("pattern_tokens") or [str(p) for p in record["meta"]["pattern_positions"]]
        fig, ax = plt.subplots(figsize=(2 + 0.25 * heads.shape[1], 1.5 + 0.18 * heads.shape[0]))
        image = ax.imshow(heads, cmap="magma", aspect="auto", vmin=0)
        ax.set_xticks(range(len(tokens)), [t.replace("$", r"\$") for t in tokens], rotation=90, fontsize=6)
        ax.set(ylabel="layer", title=f"{display(record['method'])}: KV heads keeping each token ({record['model']})")
        fig.colorbar(image, ax=ax, label="KV heads")
        made.append(save(fig, out / f"kvpop_pattern_{folder.name}.png"))
    return made


FIGURES: dict[str, Figure] = {
    "KVpop Fig. 4 efficiency": kvpop_efficiency,
    "KVpop Fig. 5 delayed scoring": kvpop_delayed_scoring,
    "KVpop Figs. 6/9 eviction patterns": kvpop_eviction_patterns,
    "KVpop Fig. 7 recall per layer and head": kvpop_retention_maps,
}
