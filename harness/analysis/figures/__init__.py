"""The papers' figures from the records on disk (``results/figures/``, matplotlib Agg): one module per paper.

Each figure reads the runs of its preset (``Figure.preset``) and is drawn only when its data exists;
``make_figures`` logs which were made and why the others were not. Methods are the variants of
``harness.analysis.variants`` (a name plus the parameters that differ from its named config), labelled
as the papers name them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from harness.analysis.figures import fdkvc, inertiakv, kvpop
from harness.analysis.figures.common import Figure
from harness.analysis.presets import preset_seed
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import restrict
from harness.analysis.variants import annotate

log = logging.getLogger(__name__)

FIGURES: dict[str, Figure] = {**inertiakv.FIGURES, **fdkvc.FIGURES, **kvpop.FIGURES}


def draw_figures(root: Path | str = "results", out: Path | str | None = None) -> dict[str, list[Path]]:
    """Every figure the records under ``root`` support, into ``out`` (``<root>/figures``): the files of each."""
    root = Path(root)
    out = Path(out) if out is not None else root / "figures"
    out.mkdir(parents=True, exist_ok=True)
    frame = annotate(load_results(root), load_configs(root))
    made: dict[str, list[Path]] = {}
    for name, figure in FIGURES.items():
        runs = frame if figure.preset is None else restrict(frame, {"seed": preset_seed(figure.preset)})
        made[name] = figure.draw(runs, root, out) if figure.preset is None or not runs.empty else []
        log.info("figure %s: %s", name, ", ".join(p.name for p in made[name]) or "not made (no data)")
    return made


def make_figures(root: Path | str = "results", out: Path | str | None = None) -> list[Path]:
    """The files of ``draw_figures``, in catalogue order."""
    return [path for files in draw_figures(root, out).values() for path in files]
