"""FD-KVC's Sec. 5.6 t-tests and ambiguity table on hand-written records: exact cells."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from scipy import stats as scipy_stats

from harness.analysis.figures import fdkvc as figures
from harness.analysis.papers import fdkvc
from harness.analysis.spec import NOT_RUN, grid
from harness.analysis.variants import variant


def records(
    variant_label: str, subtask: str, world: str = "paper", start: int = 0, **metrics: list[float]
) -> list[dict]:
    n = len(next(iter(metrics.values())))
    return [
        {
            "model": "world",
            "task": "dialogs",
            "subtask": subtask,
            "seed": 0,
            "example_id": f"{subtask}/{start + i:04d}",
            "rho": 0.0,
            "variant": variant_label,
            "method": variant_label.partition("[")[0],
            "meta.world": world,
            **{f"metric.{name}": values[i] for name, values in metrics.items()},
        }
        for i in range(n)
    ]


def cells(spec_key: str, frame: pd.DataFrame) -> dict[str, dict[str, str]]:
    spec = next(s for s in fdkvc.tables() if s.key == spec_key)
    table = grid(spec, frame)
    header, body = table.header, table.body
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_paired_ttest_cells_of_section_5_6():
    frame = pd.DataFrame(
        records("h2o", "topic_shift", alignment=[0.5, 0.6, 0.7])
        + records("fdkvc", "topic_shift", alignment=[0.6, 0.8, 0.7])
        # Another world's runs stay out of the paper's table.
        + records("fdkvc", "topic_shift", world="task.schedule=even", alignment=[0.0, 0.0, 0.0])
    )
    row = cells("fdkvc_ttests", frame)["world · Topic Shift"]
    # Differences [0.1, 0.2, 0]: mean 0.1, sd 0.1, t = 0.1 / (0.1 / sqrt 3) = sqrt 3, two dof.
    p = 2 * scipy_stats.t.sf(3**0.5, 2)
    assert row == {"H2O": "0.600", "FD-KVC": "0.700", "Δ": "+16.7%", "t": "+1.73", "p": f"{p:.3g}", "dialogs": "3"}
    assert set(cells("fdkvc_ttests", frame)["world · Mixed"].values()) == {NOT_RUN}


def test_ambiguity_table_measures_each_reading_and_says_what_holds():
    relu = variant("fdkvc", {"relevance": "relu"})
    rows = []
    # FIFO's retention in the paper's world, scenario by scenario as the schedules give it.
    for scenario, value in zip(fdkvc.BENCHMARK, (1.0, 6 / 7, 6 / 7, 6 / 7, 1.0), strict=True):
        rows += records("fifo", scenario, retention=[value, value])
    rows += records("h2o", "topic_shift", alignment=[0.5, 0.7])
    rows += records("fdkvc", "topic_shift", alignment=[0.9, 0.9])
    rows += records(relu, "topic_shift", alignment=[0.3, 0.3])
    # The w_c sweep on Mixed under relevance=relu: 0.3 wins on the dialogs every value ran.
    for value in fdkvc.W_C:
        label = variant("fdkvc", {"relevance": "relu", **fdkvc.w_c_pair(value)})
        rows += records(label, "mixed", alignment=[0.9 if value == 0.3 else 0.5, 0.5])
    # A dialog only w_c = 0 ran does not enter the comparison.
    rows += records(variant("fdkvc", {"relevance": "relu", **fdkvc.w_c_pair(0.0)}), "mixed", start=2, alignment=[1.0])
    # FIFO in another world: its subtasks carry the reading (tasks.dialogs.task.subtask_name).
    noise = "task.noise_var=0.05"
    for scenario in fdkvc.BENCHMARK:
        rows += records("fifo", f"{scenario} [{noise}]", world=noise, retention=[0.5, 0.5])
    table = cells("fdkvc_readings", pd.DataFrame(rows))
    paper = table["the paper's readings (defaults) [+experiment/fdkvc_reading=paper]"]
    assert paper["retention FIFO (91.4)"] == "91.4"
    assert paper["Topic Shift (paper +127%)"] == "+50.0%"
    assert paper["composite alignment, FD-KVC vs H2O (paper +6.7%)"] == "+50.0%"
    assert paper["best w_c (0.3)"] == NOT_RUN
    assert paper["figures held"] == "3/3"
    reading = table["relevance: max(cos, 0) [method.relevance=relu]"]
    assert reading["Topic Shift (paper +127%)"] == "-50.0%"
    assert reading["best w_c (0.3)"] == "0.3"
    # The baselines are the paper world's: the same FIFO figure.
    assert reading["retention FIFO (91.4)"] == "91.4"
    assert reading["figures held"] == "2/4; not: composite alignment, FD-KVC vs H2O, Topic Shift"
    noisy = table["noise: 0.05 as the variance [task.noise_var=0.05]"]
    assert noisy["retention FIFO (91.4)"] == "50.0" and noisy["figures held"] == "0/1; not: retention FIFO"
    assert noisy["Topic Shift (paper +127%)"] == NOT_RUN


@pytest.mark.parametrize(
    ("kind", "paper", "value", "held"),
    [
        ("change", 1.27, 0.43, True),
        ("change", 0.30, -0.45, False),
        ("percent", 0.914, 0.91428, True),
        ("percent", 0.701, 0.630, False),
        ("turns", 4.5, 4.73, True),
        ("turns", 4.5, 5.1, False),
        ("value", 0.3, 0.3, True),
        ("value", 0.8, 0.6, False),
    ],
)
def test_what_counts_as_held(kind: str, paper: float, value: float, held: bool):
    assert fdkvc.Figure("x", paper, lambda frame, reading: value, kind).held(value) is held


def test_the_default_row_averages_the_dialogs_every_ablation_value_ran():
    # fdkvc_tables' default run holds four Mixed dialogs; the w_c = 0 run of Table 5 only the first two.
    default, w_c0 = "fdkvc", variant("fdkvc", fdkvc.w_c_pair(0.0))
    frame = pd.DataFrame(
        records(default, "mixed", alignment=[0.2, 0.4, 1.0, 1.0], retention=[0.5, 0.5, 1.0, 1.0])
        + records(w_c0, "mixed", alignment=[0.6, 0.8], retention=[0.1, 0.3])
    )
    spec = next(s for s in fdkvc.tables() if s.key == "fdkvc_table5")
    table = grid(spec, frame)
    rows = {row[0]: dict(zip(table.header[1:], row[1:], strict=True)) for row in table.body}
    assert rows["world · w_c=0.45"] == {"alignment (Mixed)": "0.3000", "retention % (Mixed)": "50.0"}
    assert rows["world · w_c=0"] == {"alignment (Mixed)": "0.7000", "retention % (Mixed)": "20.0"}
    assert "n = 2 examples per cell" in table.note


def test_a_column_over_more_examples_says_its_n_in_its_header():
    frame = pd.DataFrame(
        records("h2o", "topic_shift", alignment=[0.5, 0.6]) + records("h2o", "mixed", alignment=[0.1, 0.2])
        + records("fdkvc", "topic_shift", alignment=[0.7, 0.8]) + records("fdkvc", "mixed", alignment=[0.3, 0.4])
    )  # fmt: skip
    table = grid(next(s for s in fdkvc.tables() if s.key == "fdkvc_table1"), frame)
    assert table.header[-1] == "composite (n=4)" and "Mixed" in table.header
    assert "n = 2 examples per cell" in table.note


def test_a_figures_curves_average_the_dialogs_every_run_recorded(tmp_path, monkeypatch):
    # FD-KVC's run also holds a dialog H2O's lacks (as its default run holds fdkvc_tables' 600 beside 200):
    # Fig. 3's curves average the one dialog both recorded.
    shares = {"h2o": [[[0.5, 0.5], [0.4, 0.6]]], "fdkvc": [[[0.9, 0.1], [0.8, 0.2]], [[0.0, 1.0], [0.0, 1.0]]]}
    rows = []
    for name, dialogs in shares.items():
        run = tmp_path / name
        run.mkdir()
        lines = [
            {"subtask": "topic_shift", "example_id": f"topic_shift/{i:04d}", "meta": {"turns": {"topic_retention": d}}}
            for i, d in enumerate(dialogs)
        ]
        (run / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        rows += [{**r, "run_id": name} for r in records(name, "topic_shift", alignment=[0.0] * len(dialogs))]
    drawn = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.setdefault("fig", fig) and path)
    figures.topic_shift_retention(pd.DataFrame(rows), tmp_path, tmp_path)
    curves = {line.get_label(): list(line.get_ydata()) for line in drawn["fig"].axes[0].get_lines()}
    assert curves["FD-KVC: A"] == [90.0, 80.0] and curves["FD-KVC: B"] == pytest.approx([10.0, 20.0])
    assert curves["H2O: A"] == [50.0, 40.0]
