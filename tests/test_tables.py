"""Paper tables from hand-written records (tests/fixtures/results): cells, "not run", Markdown/LaTeX, presets."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from scipy import stats as scipy_stats

from harness.analysis.papers import paper_tables, write_tables
from harness.analysis.render import latex_escape, to_latex, to_markdown
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import NOT_RUN, Scope, delta, grid, one_per_example
from harness.analysis.variants import annotate, flatten_method, variant
from harness.config import CONF_DIR, experiment_preset
from harness.record.files import DuplicateRecordError

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def frame():
    return annotate(load_results(FIXTURE), load_configs(FIXTURE))


def table(key: str, frame) -> dict[str, dict[str, str]]:
    spec = next(s for s in paper_tables() if s.key == key)
    table = grid(spec, frame)
    header, body = table.header, table.body
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_variant_labels_name_only_parameters_that_differ() -> None:
    assert variant("inertia") == "inertia"
    assert variant("inertia", {"aggregator.alpha": 0.8}) == "inertia"
    assert variant("inertia", {"aggregator.alpha": 0.5}) == "inertia[aggregator.alpha=0.5]"
    assert variant("tova", {"scorer": "keydiff"}) == "tova[scorer=keydiff]"
    # A learned scorer's model and checkpoint follow the run's model: one variant per model.
    scorer = {
        "_target_": "methods.scorers.bilinear.BilinearScorer",
        "model": "llama31_8b",
        "checkpoint": "results/bilinear/llama31_8b.safetensors",
    }
    trained = flatten_method({"name": "bilinear", "scorer": scorer})
    assert trained == {"scorer": "bilinear"} and variant("bilinear", trained) == "bilinear"


def test_annotate_reads_parameters_from_configs(frame) -> None:
    variants = set(frame["variant"])
    assert {"inertia", "inertia[aggregator.alpha=0.5]", "cumulative", "full", "fdkvc"} <= variants
    assert set(frame.loc[frame["variant"] == "cumulative", "p.aggregator"]) == {"cumulative"}


def test_table1_cells_are_benchmark_means_and_missing_cells_say_not_run(frame) -> None:
    cells = table("inertia_table1", frame)
    # The rows are the methods the preset sweeps (KeyDiff included, as in Fig. 5), the full cache first.
    assert list(cells) == ["Full cache", "TOVA", "SnapKV", "AdaKV+EA", "KeyDiff", "InertiaKV"]
    # inertia at 0.9: niah_a (100, 0) -> 50, niah_b (100, 100) -> 100; mean of subtask means 75.
    assert cells["InertiaKV"]["budget 10%"] == "75.00"
    assert cells["InertiaKV"]["budget 50%"] == "100.00"
    assert cells["InertiaKV"]["budget 25%"] == NOT_RUN
    assert cells["TOVA"]["budget 10%"] == NOT_RUN
    # The full cache ran at rho=0 and fills every budget column.
    assert {cells["Full cache"][c] for c in ("budget 50%", "budget 25%", "budget 10%")} == {"100.00"}


def test_alpha_sweep_keeps_variants_apart(frame) -> None:
    cells = table("inertia_table5", frame)
    assert list(cells) == ["α=0", "α=0.3", "α=0.5", "α=0.7", "α=0.8", "α=0.9", "α=0.95"]
    assert cells["α=0.8"]["RULER"] == "75.00"
    # alpha=0.5: niah_a (0, 0) -> 0, niah_b (0, 100) -> 50.
    assert cells["α=0.5"]["RULER"] == "25.00"
    assert cells["α=0.9"]["RULER"] == NOT_RUN and cells["α=0.8"]["LongBench"] == NOT_RUN


def test_paired_difference_is_averaged_over_subtasks_like_the_scores(frame) -> None:
    cells = table("inertia_table12", frame)
    # Cumulative - InertiaKV per example: niah_a (-100, 0), niah_b (0, 0); mean over subtasks -25.
    # Resampled within subtasks: niah_a's mean is -100, -50 or 0, niah_b's 0: the 95% interval [-50, 0].
    assert cells["tiny"]["RULER · Δ [95% CI]"] == "-25.00 [-50.00, +0.00]"
    assert cells["tiny"]["LongBench · Δ [95% CI]"] == NOT_RUN


def test_a_paired_difference_says_the_n_of_the_examples_both_sides_share(frame) -> None:
    # InertiaKV also recorded examples Cumulative did not (another length, say): the difference and its n
    # are over the four shared ones, not over every example either side recorded.
    inertia = frame[(frame["variant"] == "inertia") & (frame["task"] == "ruler") & (frame["rho"] == 0.9)]
    extra = inertia.assign(example_id=inertia["example_id"].astype(str) + "-1024", score=0.0)
    spec = next(s for s in paper_tables() if s.key == "inertia_table12")
    for records in (frame, pd.concat([frame, extra], ignore_index=True)):
        table = grid(spec, records)
        assert table.body[0][0] == "tiny" and "-25.00 [-50.00, +0.00]" in table.body[0]
        assert "n = 4 examples per cell" in table.note


def test_stratified_p_value_by_hand(frame) -> None:
    scope = Scope(frame, {"rho": 0.9, "task": "ruler"})
    p = delta({"variant": "inertia"}, {"variant": "cumulative"}, "p")(frame, scope)
    # se^2 = var(-100, 0) / 2 / 2^2 = 625 (niah_b adds none), t = 25 / 25 = 1, Welch dof = 1.
    assert p == f"{2 * scipy_stats.t.sf(1.0, 1):.3f}" == "0.500"
    assert delta({"variant": "inertia"}, {"variant": "cumulative"}, "mean")(frame, scope) == "-25.00"


def test_dialog_tables(frame) -> None:
    # The fixture's world run is the paper's world (records name it since the world readings).
    frame = frame.assign(**{"meta.world": frame["task"].where(frame["task"] != "dialogs", "paper")})
    alignment = table("fdkvc_table1", frame)["world · FD-KVC"]
    # The composite pools both scenarios' dialogs: its column says so.
    assert alignment["Mixed"] == "0.625" and alignment["Gradual"] == NOT_RUN and alignment["composite (n=4)"] == "0.625"
    assert table("fdkvc_table1", frame)["world · FIFO"]["Mixed"] == NOT_RUN
    adaptation = table("fdkvc_table2", frame)["world · FD-KVC"]
    assert adaptation["Topic Shift"] == "2.50 (50%)"
    latency = table("fdkvc_table4", frame)["world · FD-KVC"]["latency ms/turn"]
    assert latency == "0.010"
    assert table("fdkvc_table5", frame)["world · w_c=0.45"]["alignment (Mixed)"] == "0.6250"


def test_diagnostics_table(tmp_path: Path) -> None:
    root = tmp_path / "results"
    run = "tiny__inertia-aaaa0001__ruler-bbbb0001__rho0.9__seed0"
    shutil.copytree(FIXTURE / run, root / run)
    config = root / run / "config.yaml"
    config.write_text(config.read_text() + "diagnostics: true\n")
    lines = []
    for example, raw_churn in (("niah_a/0", 0.2), ("niah_a/1", 0.4), ("niah_b/0", 0.6), ("niah_b/1", 0.8)):
        summary = {"churn_raw": raw_churn, "churn_state": 0.1, "jaccard_raw_state": 0.5, "raw_top_evicted": 0.25}
        lines.append(json.dumps({"example_id": example, "subtask": example[:6], "budget": 40, "summary": summary}))
    (root / run / "diagnostics.jsonl").write_text("\n".join(lines) + "\n")
    cells = table("inertia_table13", load_diagnostics_frame(root))
    traced = cells["tiny · RULER · α=0.8"]
    # Means over subtasks of subtask means: (0.3 + 0.7) / 2; trace accuracy is the records' 75.
    assert traced["raw churn"] == "0.500" and traced["EMA churn"] == "0.100"
    assert traced["raw/EMA Jaccard"] == "0.500" and traced["raw-top evicted"] == "0.250"
    assert traced["trace accuracy"] == "75.00"
    assert set(cells["tiny · RULER · α=0.3"].values()) == {NOT_RUN}
    # The plain run of the same configuration is not a traced one.
    assert set(table("inertia_table13", load_diagnostics_frame(FIXTURE)).get("tiny · RULER · α=0.8", {})) <= {NOT_RUN}


def load_diagnostics_frame(root: Path = FIXTURE):
    from harness.analysis.diagnostics import load_diagnostics

    return annotate(load_diagnostics(root), load_configs(root))


def test_a_cell_counts_the_full_cache_once_and_refuses_two_runs_of_another_method() -> None:
    def rows(*runs: tuple[str, str, float]) -> pd.DataFrame:
        keys = {"model": "tiny", "task": "ruler", "subtask": "niah_single_1", "seed": 0, "example_id": "e0"}
        return pd.DataFrame([{**keys, "variant": v, "run_id": r, "rho": rho, "score": rho} for v, r, rho in runs])

    full = one_per_example(rows(("full", "full_a", 0.9), ("full", "full_b", 0.0)))
    assert full["run_id"].tolist() == ["full_b"] and len(full) == 1
    # A learned scorer's two checkpoints for one model share its label: the cell cannot choose.
    with pytest.raises(DuplicateRecordError, match="example 'e0', from runs bilinear_a, bilinear_b — move the stale"):
        one_per_example(rows(("bilinear", "bilinear_a", 0.9), ("bilinear", "bilinear_b", 0.9)))


def test_cost_table_retained_tokens_are_the_entries_held_per_head_not_the_longest_head(frame) -> None:
    # Figure 6's length; a ragged cache (AdaKV's heads) holds 20.25 entries per head on average,
    # its longest head 50.
    costs = frame[(frame["task"] == "ruler") & (frame["variant"] == "inertia") & (frame["rho"] == 0.9)].copy()
    costs["meta.length"], costs["cache_len_final"], costs["kv_entries_held"] = 2048, 50, 20.25
    assert table("inertia_costs", costs)["InertiaKV"]["retained tokens"] == "20"


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
#: The CPU forms' backbones: SmolLM2-135M everywhere, and Qwen2.5-Coder-0.5B beside it in InertiaKV's.
CPU_MODELS = {"smollm2_135m", *experiment_preset("inertia/benchmarks.yaml")["forms"]["cpu"]["model"].split(",")}


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
                assert cfg.model.name in CPU_MODELS or cfg.task.get("name") == "dialogs"
                if cfg.task.get("n") is not None:
                    assert cfg.task.n <= 10


def test_table14_has_the_papers_three_decimals_and_no_longbench_v2_interval(frame) -> None:
    lazy = frame[frame["variant"] == "cumulative"].assign(variant="inertia_lazy", method="inertia_lazy")
    v2 = frame[(frame["variant"].isin(["inertia", "cumulative"])) & (frame["rho"] == 0.9)]
    v2 = v2.assign(task="longbench_v2", subtask=None, score=v2["score"] / 100)
    v2 = v2.assign(variant=v2["variant"].replace({"cumulative": "inertia_lazy"}))
    cells = table("inertia_table14", pd.concat([frame, lazy, v2], ignore_index=True))
    # RULER as Table 12's difference, to three decimals; LongBench-v2's difference alone.
    assert cells["tiny"]["RULER · Δ [95% CI]"] == "-25.000 [-50.000, +0.000]"
    assert cells["tiny"]["LongBench-v2 · Δ"] == "-0.250"


def test_figure_1_pairs_retained_sets_within_a_model_when_the_table_has_no_model_axis() -> None:
    from harness.analysis.papers.inertiakv import diag, retention_jaccard

    # Two models trace the same example; without a model axis the cell sees both. Model a's two scorers keep
    # the same set (Jaccard 1), model b's disjoint ones (0): pairing across models would mix them or fail.
    rows = []
    for model, vnorm_kept in (("a", [[1, 2]]), ("b", [[3, 4]])):
        rows.append({"model": model, "example_id": "e0", "variant": diag("inertia"), "kept": [[1, 2]]})
        rows.append(
            {"model": model, "example_id": "e0", "variant": diag("inertia", {"scorer": "vnorm"}), "kept": vnorm_kept}
        )
    frame = pd.DataFrame(rows)
    assert retention_jaccard("attention", "vnorm")(frame, Scope(frame, {"method": "inertia"})) == "0.500"


def test_a_fault_in_making_the_tables_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.analysis.__main__ as entry

    def broken(root: Path) -> list[Path]:
        raise ValueError("a table's own bug")

    monkeypatch.setattr(entry, "write_tables", broken)
    # A ValueError of the code, not a user's mistake: not folded into a one-line UserError.
    with pytest.raises(ValueError, match="a table's own bug"):
        entry.main([str(tmp_path)])


def test_a_table_whose_distinctive_runs_are_missing_still_keeps_its_models_apart() -> None:
    from harness.analysis.spec import models

    # Table 5's model axis counts the models that ran alpha=0.3; before any did, both backbones' default
    # runs must still land in rows of their own, never in one cell.
    frame = pd.DataFrame({"model": ["a", "b"], "variant": ["inertia", "inertia"]})
    lines = models({"variant": "inertia[aggregator.alpha=0.3]"})(frame)
    assert [(line.label, line.where) for line in lines] == [("a", {"model": "a"}), ("b", {"model": "b"})]
    # One model alone mixes nothing: its table keeps the unnamed line.
    assert [line.label for line in models({"variant": "x"})(frame.iloc[:1])] == [""]


def test_the_needle_heatmap_averages_the_examples_every_method_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.analysis.figures import inertiakv as figures

    # The full cache recorded a second example at the same length and depth that TOVA did not: its panel
    # shows the example both recorded, as a table cell would. TOVA at another budget stays out.
    rows = [
        {"model": "m", "task": "needle", "variant": "full", "rho": 0.0, "example_id": "a", "score": 100.0},
        {"model": "m", "task": "needle", "variant": "full", "rho": 0.0, "example_id": "b", "score": 0.0},
        {"model": "m", "task": "needle", "variant": "tova", "rho": 0.9, "example_id": "a", "score": 40.0},
        {"model": "m", "task": "needle", "variant": "tova", "rho": 0.5, "example_id": "b", "score": 90.0},
    ]
    frame = pd.DataFrame([{**row, "subtask": None, "seed": 0, "meta.length": 512, "meta.depth": 50.0} for row in rows])
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig) or path)
    figures.needle_heatmap(frame, Path("."), Path("."))
    panels = {ax.get_title(): ax.get_images()[0].get_array().tolist() for ax in drawn[0].axes if ax.get_images()}
    assert panels == {"Full cache": [[100.0]], "TOVA": [[40.0]]}
