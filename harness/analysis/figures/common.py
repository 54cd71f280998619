"""What the figures share: the figure signature, saving, and the selections every paper's figures make."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

#: A figure: (annotated records, results root, output folder) -> the files it wrote (none without data).
Figure = Callable[[pd.DataFrame, Path, Path], list[Path]]


def save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def by_length(part: pd.DataFrame) -> list[tuple[object, pd.DataFrame]]:
    """One panel per nominal context length (``meta.length``) when the records span several."""
    lengths = part["meta.length"] if "meta.length" in part.columns else None
    if lengths is None or not pd.api.types.is_numeric_dtype(lengths) or lengths.nunique() < 2:
        return [(None, part)]
    return list(part.groupby("meta.length"))
