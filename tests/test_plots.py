"""Figures from the hand-written fixture records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from harness.analysis.figures import inertiakv as plots
from harness.analysis.figures import make_figures

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def test_figures_made_for_fixture_data(tmp_path: Path) -> None:
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    made = {p.name: p for p in make_figures(root)}
    # The fixture holds InertiaKV at two ratios with the full cache, and two alphas at 90%.
    expected = {"inertia_fig5_budget_tiny.png", "inertia_fig9_alpha_tiny.png"}
    assert expected <= set(made), sorted(made)
    assert all(p.stat().st_size > 1000 for p in made.values())


def test_no_figures_without_records(tmp_path: Path) -> None:
    assert make_figures(tmp_path / "empty") == []


def test_quality_vs_budget_has_one_panel_per_length(tmp_path: Path, monkeypatch) -> None:
    rows = []
    for length, drop in ((1024, 0.0), (4096, 40.0)):
        rows.append({"variant": "full", "rho": 0.0, "score": 100.0, "meta.length": length})
        for rho, score in ((0.5, 90.0), (0.9, 70.0)):
            rows.append({"variant": "inertia", "rho": rho, "score": score - drop, "meta.length": length})
    frame = pd.DataFrame(rows).assign(
        model="tiny", task="ruler", subtask="niah_single_1", primary_metric="string_match_all", seed=0
    )
    frame["example_id"] = [f"niah_single_1/{i}" for i in range(len(frame))]
    frame["method"] = frame["variant"]
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    plots.quality_vs_budget(frame, tmp_path, tmp_path)
    [figure] = figures
    curves = [[list(line.get_ydata()) for line in ax.get_lines()] for ax in figure.axes]
    # Per panel: the inertia curve over rho, then the full-cache line; no averaging across lengths.
    assert curves == [[[90.0, 70.0], [100.0, 100.0]], [[50.0, 30.0], [100.0, 100.0]]]
    assert [ax.get_title() for ax in figure.axes] == ["RULER 1024", "RULER 4096"]
    figures.clear()
    plots.quality_vs_budget(frame[frame["meta.length"] == 1024], tmp_path, tmp_path)
    assert len(figures[0].axes) == 1
