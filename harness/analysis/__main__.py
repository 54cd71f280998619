"""``python -m harness.analysis [results_dir]`` (``make tables``): the papers' tables, then the figures.

Everything is recomputed from the records under ``results_dir`` (default ``results``).
"""

from __future__ import annotations

import logging
import sys

from harness.analysis.figures import make_figures
from harness.analysis.papers import write_tables
from harness.analysis.report import existing_root
from harness.analysis.results import RESULTS_MISTAKES
from harness.errors import cli, user_errors

log = logging.getLogger(__name__)


def main(argv: list[str]) -> None:
    """Tables, then figures, from ``argv[0]`` (default ``results``)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = existing_root(argv)
    with user_errors(RESULTS_MISTAKES):
        written = write_tables(root)
        log.info("tables: %d files in %s", len(written), root / "tables")
        figures = make_figures(root)
    log.info("figures: %s", ", ".join(p.name for p in figures) or "none (no data for any figure)")


if __name__ == "__main__":
    cli(lambda: main(sys.argv[1:]))
