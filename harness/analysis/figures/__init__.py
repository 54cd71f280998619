"""The papers' figures from the records on disk (``results/figures/``, matplotlib Agg): one module per paper.

Each figure is drawn only when its data exists; ``make_figures`` logs which were made and
why the others were not. Methods are the variants of ``harness.analysis.variants`` (a name plus the
parameters that differ from its named config), labelled as the papers name them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from harness.analysis.figures import fdkvc, inertiakv, kvpop
from harness.analysis.figures.common import Figure
from harness.analysis.results import load_configs, load_results
from harness.analysis.variants import annotate

log = logging.getLogger(__name__)

FIGURES: dict[str, Figure] = {**inertiakv.FIGURES, **fdkvc.FIGURES, **kvpop.FIGURES}
# Figures that need no records (none: the retention panels find their runs through the records).
WITHOUT_RECORDS: set[str] = set()


def make_figures(root: Path | str = "results", out: Path | str | None = None) -> list[Path]:
    """Every figure the records under ``root`` support, into ``out`` (``<root>/figures``)."""
    root = Path(root)
    out = Path(out) if out is not None else root / "figures"
    out.mkdir(parents=True, exist_ok=True)
    frame = annotate(load_results(root), load_configs(root))
    made: list[Path] = []
    for name, figure in FIGURES.items():
        files = figure(frame, root, out) if not frame.empty or name in WITHOUT_RECORDS else []
        log.info("figure %s: %s", name, ", ".join(p.name for p in files) if files else "not made (no data)")
        made += files
    return made
