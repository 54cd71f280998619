"""What the figures share: the figure type and saving."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

#: Drawing a figure: (its preset's annotated records, results root, output folder) -> the files written
#: (none without data).
Draw = Callable[[pd.DataFrame, Path, Path], list[Path]]


@dataclass(frozen=True)
class Figure:
    """A paper figure: how it is drawn and the ``conf/experiment`` preset whose runs it reads.

    The figure sees only its preset's runs (their seed, ``harness.analysis.presets``): a timing figure
    then reads the runs timed for it, never a benchmark sweep's decode of the same examples. ``None``:
    the figure needs no records (an illustration, or a figure drawn from training histories).
    """

    draw: Draw
    preset: str | None


def save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
