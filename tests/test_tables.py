"""Paper tables from hand-written records (tests/fixtures/results): cells, "not run", Markdown/LaTeX, presets."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from scipy import stats as scipy_stats

from harness.analysis.papers import paper_tables, write_tables
from harness.analysis.render import latex_escape, to_latex, to_markdown
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import NOT_RUN, grid
from harness.analysis.variants import annotate, variant
from harness.config import CONF_DIR

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def frame():
    return annotate(load_results(FIXTURE), load_configs(FIXTURE))


def table(key: str, frame) -> dict[str, dict[str, str]]:
    spec = next(s for s in paper_tables() if s.key == key)
    header, body = grid(spec, frame)
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_variant_labels_name_only_parameters_that_differ() -> None:
    assert variant("inertia") == "inertia"
    assert variant("inertia", {"aggregator.alpha": 0.8}) == "inertia"
    assert variant("inertia", {"aggregator.alpha": 0.5}) == "inertia[aggregator.alpha=0.5]"
    assert variant("tova", {"scorer": "keydiff"}) == "tova[scorer=keydiff]"


def test_annotate_reads_parameters_from_configs(frame) -> None:
    variants = set(frame["variant"])
    assert {"inertia", "inertia[aggregator.alpha=0.5]", "cumulative", "full", "fdkvc"} <= variants
    assert set(frame.loc[frame["variant"] == "cumulative", "p.aggregator"]) == {"cumulative"}


def test_table1_cells_are_benchmark_means_and_missing_cells_say_not_run(frame) -> None:
    cells = table("inertia_table1", frame)
    # inertia at 0.9: niah_a (100, 0) -> 50, niah_b (100, 100) -> 100; mean of subtask means 75.
    assert cells["tiny · InertiaKV"]["512 · ρ=0.9"] == "75.0"
    assert cells["tiny · InertiaKV"]["512 · ρ=0.5"] == "100.0"
    assert cells["tiny · InertiaKV"]["512 · ρ=0.75"] == NOT_RUN
    assert cells["tiny · TOVA"]["512 · ρ=0.9"] == NOT_RUN
    # The full cache ran at rho=0 and fills every ratio column.
    assert {cells["tiny · Full cache"][c] for c in ("512 · ρ=0.5", "512 · ρ=0.75", "512 · ρ=0.9")} == {"100.0"}


def test_alpha_sweep_keeps_variants_apart(frame) -> None:
    cells = table("inertia_table5", frame)
    assert cells["tiny · α=0.8"]["average"] == "75.0"
    assert cells["tiny · α=0.5"]["average"] == "25.0"
    assert cells["tiny · α=0.9"]["average"] == NOT_RUN


def test_paired_difference_with_ci_and_scipy_p(frame) -> None:
    cells = table("inertia_table12", frame)
    average = cells["tiny · ρ=0.9 · average"]
    assert average["InertiaKV"] == "75.0" and average["Cumulative"] == "50.0"
    mean, low, high, n = re.match(r"([-+\d.]+) \[([-+\d.]+), ([-+\d.]+)\] \(n=(\d+)\)", average["Δ [95% CI]"]).groups()
    assert float(mean) == -25.0 and int(n) == 4 and float(low) <= -25.0 <= float(high)
    expected = scipy_stats.ttest_rel([0, 0, 100, 100], [100, 0, 100, 100]).pvalue
    assert average["p"] == f"{expected:.3f}"
    assert cells["tiny · ρ=0.5 · average"]["Δ [95% CI]"] == NOT_RUN


def test_dialog_tables(frame) -> None:
    alignment = table("fdkvc_table1", frame)["world · FD-KVC"]
    assert alignment["mixed"] == "0.625" and alignment["gradual"] == NOT_RUN and alignment["composite"] == "0.625"
    assert table("fdkvc_table1", frame)["world · FIFO"]["mixed"] == NOT_RUN
    adaptation = table("fdkvc_table2", frame)["world · FD-KVC"]
    assert adaptation["topic_shift"] == "2.50 (50%)"
    latency = table("fdkvc_table4", frame)["world · FD-KVC"]["latency µs/turn"]
    assert latency == "10.0"
    assert table("fdkvc_table5", frame)["world · w_c=0.45"]["alignment (mixed)"] == "0.6250"


def test_diagnostics_table(frame) -> None:
    cells = table("inertia_table13", load_diagnostics_frame())
    assert cells["tiny · InertiaKV"]["top-B churn"] == "0.500"


def load_diagnostics_frame():
    from harness.analysis.diagnostics import load_diagnostics

    return annotate(load_diagnostics(FIXTURE), load_configs(FIXTURE))


def test_kvpop_relative_to_full(frame) -> None:
    cells = table("kvpop_table2", frame)
    assert cells["tiny · Full cache"]["ruler · ρ=0.75"] == "100.0%"
    assert cells["tiny · InertiaKV"]["ruler · ρ=0.75"] == NOT_RUN
    assert cells["tiny · InertiaKV"]["aime · ρ=0.88"] == NOT_RUN


def test_markdown_and_latex_are_well_formed() -> None:
    header = ["", "a|b", "ρ=0.5"]
    body = [["x_1 & y", "50%", "not run"], ["Δ", "#", "~"]]
    md = to_markdown(header, body).splitlines()
    assert len({len(re.findall(r"(?<!\\)\|", line)) for line in md}) == 1
    assert md[1] == "|---|---|---|"
    tex = to_latex(header, body, "Table: 50% of α", "t1")
    assert tex.count(r"\begin{tabular}{lrr}") == 1 and tex.count(r"\end{tabular}") == 1
    rows = [line for line in tex.splitlines() if line.endswith(r"\\")]
    assert len(rows) == 3 and all(len(re.findall(r"(?<!\\)&", row)) == 2 for row in rows)
    assert latex_escape("x_1 & 50% ρ") == r"x\_1 \& 50\% $\rho$"


def test_write_tables_on_fixture_and_on_no_results(tmp_path: Path) -> None:
    written = write_tables(FIXTURE, tmp_path / "tables")
    names = {p.name for p in written}
    assert {"inertia_table1.md", "inertia_table1.tex", "fdkvc_table6.tex", "kvpop_table2.md", "index.md"} <= names
    assert all(p.stat().st_size > 0 for p in written)
    assert "+experiment=inertia_table12 scale=cpu" in (tmp_path / "tables" / "index.md").read_text()
    empty = write_tables(tmp_path / "nothing", tmp_path / "empty")
    text = (tmp_path / "empty" / "inertia_table1.md").read_text()
    assert NOT_RUN in text and "75.0" not in text
    assert len(empty) == len(written)


def test_make_tables_cli_writes_tables_and_figures(tmp_path: Path) -> None:
    from harness.analysis.__main__ import main

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    main([str(root)])
    assert (root / "tables" / "index.md").is_file()
    assert any((root / "figures").glob("*.png"))


# --------------------------------------------------------------------------- presets
def _sweep_jobs(preset: str, scale: str) -> list[list[str]]:
    cfg = compose("config", overrides=[f"+experiment={preset}", f"scale={scale}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params or {}
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return BasicSweeper.split_arguments(overrides, None)[0]


def _pending(job: list[str]) -> bool:
    # A sweep value naming a config not in conf/ yet (e.g. method=kvpop before it lands).
    for override in job:
        key, _, value = override.lstrip("+").partition("=")
        if key in ("method", "task", "model") and not (CONF_DIR / key / f"{value}.yaml").is_file():
            return True
    return False


PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def test_every_table_has_a_preset() -> None:
    for spec in paper_tables():
        assert spec.preset in PRESETS, f"{spec.key}: no conf/experiment/{spec.preset}.yaml"


@pytest.mark.parametrize("scale", ["cluster", "cpu"])
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_every_sweep_job_at_both_scales(preset: str, scale: str) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        jobs = _sweep_jobs(preset, scale)
        assert jobs, f"{preset} sweeps nothing"
        ready = [job for job in jobs if not _pending(job)]
        assert ready
        for job in ready:
            cfg = compose("config", overrides=[f"+experiment={preset}", f"scale={scale}", *job])
            OmegaConf.resolve(cfg)
            if scale == "cpu":
                assert cfg.model.name == "smollm2_135m" or cfg.task.name == "dialogs"
                if cfg.task.get("n") is not None:
                    assert cfg.task.n <= 10
