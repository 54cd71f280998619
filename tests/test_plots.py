"""Figures from the hand-written fixture records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from harness.analysis.figures import inertiakv as plots
from harness.analysis.figures import kvpop as kvpop_plots
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


def test_no_figures_without_records_but_the_illustration(tmp_path: Path) -> None:
    # Figure 4 illustrates EMA on two made-up score series: it needs no records.
    assert [path.name for path in make_figures(tmp_path / "empty")] == ["inertia_fig4_boundary_flips.png"]


def test_boundary_illustration_flips_five_of_sixteen_raw_steps_and_none_under_ema(tmp_path: Path, monkeypatch) -> None:
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    plots.boundary_flips(pd.DataFrame(), tmp_path, tmp_path)
    titles = [ax.get_title() for ax in figures[0].axes]
    assert titles == [
        "(a) raw per-step score: B above A on 5 of 16 steps",
        "(b) EMA, α=0.8: B above A on 0 of 16 steps",
    ]


def test_quality_vs_budget_has_one_panel_per_length(tmp_path: Path, monkeypatch) -> None:
    rows = []
    for length, drop in ((1024, 0.0), (4096, 40.0)):
        rows.append({"variant": "full", "rho": 0.0, "score": 100.0, "meta.length": length})
        for rho, score in ((0.5, 90.0), (0.9, 70.0)):
            rows.append({"variant": "inertia", "rho": rho, "score": score - drop, "meta.length": length})
    frame = pd.DataFrame(rows).assign(
        model="tiny", task="ruler", subtask="niah_single_1", primary_metric="string_match_all", seed=0
    )
    # One example per length, decoded by every configuration.
    frame["example_id"] = [f"niah_single_1/{length}/0000" for length in frame["meta.length"]]
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


def test_a_curve_point_averages_only_the_examples_every_point_ran(tmp_path: Path, monkeypatch) -> None:
    # The 0.5 point ran a second example that the 0.9 point lacks: it must not lift the 0.5 point.
    rows = [
        {"variant": "inertia", "rho": 0.5, "score": 50.0, "example_id": "niah_single_1/512/0000"},
        {"variant": "inertia", "rho": 0.5, "score": 100.0, "example_id": "niah_single_1/512/0001"},
        {"variant": "inertia", "rho": 0.9, "score": 10.0, "example_id": "niah_single_1/512/0000"},
    ]
    frame = pd.DataFrame(rows).assign(
        model="tiny", task="ruler", subtask="niah_single_1", seed=0, method="inertia", **{"meta.length": 512}
    )
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    plots.quality_vs_budget(frame, tmp_path, tmp_path)
    assert [list(line.get_ydata()) for line in figures[0].axes[0].get_lines()] == [[50.0, 10.0]]


def test_app_h_draws_dms_from_its_traced_run_whichever_run_comes_first(tmp_path: Path, monkeypatch) -> None:
    # kvpop_table1's untraced DMS run shares kvpop_fig7's seed; listed first, it once hid the traced one.
    heads = [[0, 1, 2], [2, 2, 0]]
    traced = {"example_id": "aime_2024/60/s0", "meta": {"pattern_heads": heads, "pattern_positions": [4, 5, 6]}}
    for run_id, record in (("dms_table1", {"example_id": "aime_2024/60/s0", "meta": {}}), ("dms_fig7", traced)):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "records.jsonl").write_text(json.dumps(record) + "\n")
    frame = pd.DataFrame({"run_id": ["dms_table1", "dms_fig7"], "method": "dms", "model": "tiny", "rho": 0.875}).assign(
        **{"meta.recall_l0_h0": 0.5, "meta.recall_l0_h1": 0.25}
    )
    figures = []
    monkeypatch.setattr(kvpop_plots, "save", lambda fig, path: figures.append(fig) or path)
    assert [p.name for p in kvpop_plots.dms_sparsity(frame, tmp_path, tmp_path)] == ["kvpop_apph_dms_tiny_rho0.875.png"]
    coverage = figures[0].axes[0].get_lines()
    # Per layer: the share of the tail no head keeps, then the share both KV heads keep.
    assert [list(line.get_ydata()) for line in coverage] == [[1 / 3, 1 / 3], [1 / 3, 2 / 3]]
