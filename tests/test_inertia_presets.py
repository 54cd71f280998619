"""The fast InertiaKV presets, in their CPU form on a tiny model, fill every cell of their tables.

Each sweep job of ``conf/experiment/inertia_table4``, ``_table14`` and ``_table13`` runs as
``python -m harness.run`` would run it (``tests/preset_runs.py``), with ``model=tiny_llama``, one
example per task and the hub benchmarks restored: the CPU form leaves LongBench and LongBench-v2 out
because their data comes from the hub, so here they read small files in the hub schema written by the
test (long enough for SnapKV's 32-entry window at 90%). Every preset of every paper into one root:
``tests/test_presets_one_root.py``.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from preset_runs import annotated, run_presets, table_keys, unfilled

from harness.analysis.figures import inertiakv as inertia_figures
from harness.analysis.papers import inertiakv as inertia_tables
from harness.analysis.papers import write_tables
from harness.config import CONF_DIR

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("inertia_*.yaml"))
FAST = ("inertia_table4", "inertia_table14", "inertia_table13")


def test_every_inertia_table_and_figure_has_a_preset() -> None:
    assert {spec.preset for spec in inertia_tables.tables()} <= set(PRESETS)
    assert {figure.preset for figure in inertia_figures.FIGURES.values()} - {None} <= set(PRESETS)
    for preset in PRESETS:
        text = (CONF_DIR / "experiment" / f"{preset}.yaml").read_text()
        assert "scale=cpu" in text and yaml.safe_load(text).get("hydra"), preset


def test_the_fast_presets_fill_every_cell(tmp_path: Path) -> None:
    root = tmp_path / "results"
    pending = run_presets(FAST, root, models="tiny_llama")
    write_tables(root)
    assert unfilled(root / "tables", table_keys(FAST), pending) == []
    assert inertia_figures.lazy_quality(annotated(root), root, tmp_path) != []
