"""Figures from the hand-written fixture records."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.plots import make_figures

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def test_figures_made_for_fixture_data(tmp_path: Path) -> None:
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    made = {p.name: p for p in make_figures(root)}
    expected = {
        "quality_vs_budget_ruler_tiny.png",
        "throughput_tiny.png",
        "decode_composition_ruler_tiny.png",
        "retention_panels.png",
        "dialog_turns.png",
        "alpha_sensitivity_tiny.png",
    }
    assert expected <= set(made), sorted(made)
    assert all(p.stat().st_size > 1000 for p in made.values())


def test_no_figures_without_records(tmp_path: Path) -> None:
    assert make_figures(tmp_path / "empty") == []
