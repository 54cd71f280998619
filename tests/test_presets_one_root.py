"""Every paper's presets, run into one results root in one order, leave ``make tables`` whole and unmixed.

The presets run their CPU forms on tiny models (``tests/preset_runs.py``) into a single root, where their
runs meet: a benchmark sweep decodes the examples the efficiency preset times, FD-KVC's default holds
``fdkvc_tables``' dialogs beside Table 5's, KVpop's Fig. 4 sweeps the generation limit and times Table 1's
examples at Table 1's own limit, Fig. 7 traces Table 1's rows. Then every cell of their tables fills, each
over the examples its table's configurations share, and every figure is drawn from its own preset's runs.
The default test runs the presets where these meetings happen (a few minutes); ``-m slow`` runs every
CPU preset, with the hub benchmarks, KVpop's Table 2 and FD-KVC's readings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from preset_runs import annotated, run_presets, table_keys, unfilled

from harness.analysis.figures import FIGURES, draw_figures
from harness.analysis.papers import write_tables
from harness.analysis.presets import preset_seed
from harness.analysis.results import GENERATION_LIMIT
from harness.config import CONF_DIR

#: In this order the benchmark runs come first, the timed and traced ones after: the order that let them mix.
MEETING = (
    "inertia_table12",
    "inertia_efficiency",
    "fdkvc_tables",
    "fdkvc_table5",
    "fdkvc_table6",
    "kvpop_table1",
    "kvpop_fig4",
    "kvpop_fig7",
)
EVERY = tuple(sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))


def check_root(root: Path, presets: tuple[str, ...], pending: set[str]) -> None:
    """Every cell of the presets' tables filled, every figure of theirs drawn."""
    write_tables(root)
    drawn = draw_figures(root)
    assert unfilled(root / "tables", table_keys(presets), pending) == []
    expected = [name for name, figure in FIGURES.items() if figure.preset in (*presets, None)]
    assert [name for name in expected if not drawn[name]] == []


def test_the_presets_whose_runs_meet_share_one_root(tmp_path: Path) -> None:
    root = tmp_path / "results"
    pending = run_presets(MEETING, root, short=True)
    check_root(root, MEETING, pending)
    frame = annotated(root)
    # The efficiency preset decoded Table 12's examples again, in run folders of its own, for both backbones:
    # plain for the throughput figures, profiled for Figure 3's composition.
    timed = frame[(frame["variant"] == "inertia") & (frame["example_id"] == "niah_single_1/512/0000")]
    seeds = timed.groupby("model")["seed"].apply(sorted).to_dict()
    own = preset_seed("inertia_efficiency")
    assert seeds == {model: [0, own, own] for model in ("tiny_llama", "tiny_qwen2")}
    assert timed["run_id"].nunique() == 6
    assert sorted(timed.groupby("model")["score_s"].count()) == [1, 1]
    # Table 5's default w_c averages the ablation's 2 dialogs, not fdkvc_tables' 3, and so does every cell.
    table5 = (root / "tables" / "fdkvc_table5.md").read_text()
    assert "n = 2 examples per cell" in table5 and "(n=" not in table5
    # Fig. 4 timed Table 1's examples at Table 1's own limit, under its seed: no clash, no shared folder.
    teacher = frame[(frame["method"] == "full") & (frame["task"] == "aime") & (frame[GENERATION_LIMIT] == 16)]
    assert sorted(teacher["seed"].unique()) == [0, preset_seed("kvpop_fig4")] and teacher["run_id"].nunique() == 2


@pytest.mark.slow
def test_every_cpu_preset_into_one_root(tmp_path: Path) -> None:
    root = tmp_path / "results"
    pending = run_presets(EVERY, root)
    check_root(root, EVERY, pending)
