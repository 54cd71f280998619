"""KVpop's figures: retention maps per layer and head."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.figures.common import Figure, save  # noqa: E402
from harness.analysis.variants import display  # noqa: E402


def kvpop_retention_maps(frame: pd.DataFrame, root: Path, out: Path) -> list[Path]:
    """KVpop's per-layer x per-head top-k recall vs the teacher, when records carry it."""
    columns = [c for c in frame.columns if c.startswith("meta.recall")]
    if not columns:
        return []
    made = []
    for (model, name), part in frame[frame[columns[0]].notna()].groupby(["model", "variant"]):
        # meta.recall_l<layer>_h<head>: scalar meta fields, as harness.analysis.results keeps them.
        cells = {tuple(int(x[1:]) for x in c.split("_")[1:3]): part[c].mean() for c in columns}
        layers, heads = max(k[0] for k in cells) + 1, max(k[1] for k in cells) + 1
        grid = np.full((layers, heads), np.nan)
        for (layer, head), value in cells.items():
            grid[layer, head] = value
        fig, ax = plt.subplots(figsize=(1.5 + 0.3 * heads, 1.5 + 0.2 * layers))
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set(xlabel="KV head", ylabel="layer", title=f"{display(name)} top-k recall ({model})")
        fig.colorbar(image, ax=ax)
        made.append(save(fig, out / f"kvpop_retention_{model}_{name}.png"))
    return made


FIGURES: dict[str, Figure] = {"KVpop retention maps": kvpop_retention_maps}
