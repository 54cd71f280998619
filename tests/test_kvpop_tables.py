"""KVpop's Tables 1-2 and figures from hand-written records: rows at each CR point's budget, Abs and Rel, presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from harness.analysis.papers import paper_tables
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import NOT_RUN, grid
from harness.analysis.variants import annotate
from harness.config import CONF_DIR

# (competition, problem, correct) per run; pass@1 per competition is the mean over its records.
FULL = [("aime_2024", "1", 1), ("aime_2024", "2", 1), ("aime_2025", "1", 1), ("hmmt_feb_2025", "1", 0),
        ("hmmt_nov_2025", "1", 1)]  # fmt: skip
KVPOP = [("aime_2024", "1", 1), ("aime_2024", "2", 0), ("aime_2025", "1", 1), ("hmmt_feb_2025", "1", 0),
         ("hmmt_nov_2025", "1", 0)]  # fmt: skip


def write_run(
    root: Path, method: dict, rho: float, rows: list[tuple[str, str, int]], tag: str, seed: int = 0, limit: int = 192
) -> None:
    """One run per task of ``rows``; ``limit`` is the generation limit in the records' task identity."""
    for task in ("aime", "hmmt"):
        run_id = f"tiny__{method['name']}-{tag}__{task}-cccc{limit:04d}__rho{rho}__seed{seed}"
        folder = root / run_id
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump({"method": method, "rho": rho, "seed": seed}))
        records = [
            {"run_id": run_id, "model": "tiny", "method": method["name"], "task": task, "rho": rho, "seed": seed,
             "subtask": competition, "example_id": f"{competition}/{problem}/s0", "prediction": "x",
             "metrics": {"correct": float(correct)}, "meta": {"problem_id": problem},
             "identity": {"task": {"max_new_tokens": limit}}}
            for competition, problem, correct in rows
            if competition.startswith(task)
        ]  # fmt: skip
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def kvpop(budget: int, rho: float) -> dict:
    return {"_target_": "methods.kvpop.KVpop", "name": "kvpop", "checkpoint": f"results/kvpop/tiny/kvpop_B{budget}",
            "scorer_kind": "mlstm", "rho": rho, "budget_tokens": budget, "count_state": True}  # fmt: skip


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> dict[str, dict[str, str]]:
    root = tmp_path_factory.mktemp("results")
    write_run(root, {"_target_": "methods.full.FullCache", "name": "full"}, 0.0, FULL, "aaaa0001")
    write_run(root, kvpop(96, 0.75), 0.75, KVPOP, "aaaa0002")
    # the same method at rho 0.75 but another budget: no cell of the paper's tables
    write_run(root, kvpop(200, 0.75), 0.75, FULL, "aaaa0003")
    streaming = {"_target_": "methods.scored.ScoredEviction", "name": "streaming_llm",
                 "selection": {"rho": 0.875, "budget_tokens": 48, "sinks": 4}}  # fmt: skip
    write_run(root, streaming, 0.875, [(c, p, 0) for c, p, _ in FULL], "aaaa0004")
    # Fig. 7's traced run of the same row: another variant, no cell of Table 1.
    write_run(root, {**kvpop(96, 0.75), "recall_queries": 16, "pattern_tail": 112}, 0.75, FULL, "aaaa0005")
    # Fig. 4's timed runs: the teacher under Fig. 4's seed at two generation limits (no clash, no cell).
    for limit in (64, 128):
        write_run(root, {"_target_": "methods.full.FullCache", "name": "full"}, 0.0, KVPOP, "aaaa0001", 1000, limit)
    frame = annotate(load_results(root), load_configs(root))
    spec = next(s for s in paper_tables() if s.key == "kvpop_table1")
    table = grid(spec, frame)
    header, body = table.header, table.body
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_table1_has_the_papers_columns_and_rows(cells) -> None:
    # Most cells cover one problem (the note says n = 1); the columns over more say theirs.
    assert list(cells["tiny · Teacher"]) == [
        "AIME 2024 (n=2)", "AIME 2025", "HMMT 2502", "HMMT 2511", "Abs (n=5)", "Rel (n=5)"
    ]  # fmt: skip
    labels = [label.removeprefix("tiny · ") for label in cells]
    assert labels[:8] == ["Teacher", "CR=75% · StreamLLM", "CR=75% · TOVA", "CR=75% · StreamLLM+", "CR=75% · DMS",
                          "CR=75% · KVpop mlp", "CR=75% · KVpop", "CR=75% · KVpop (no delay)"]  # fmt: skip
    assert len(labels) == 1 + 2 * 7


def test_cells_are_pass_at_1_per_competition_their_average_and_the_ratio(cells) -> None:
    columns = ("AIME 2024 (n=2)", "AIME 2025", "HMMT 2502", "HMMT 2511", "Abs (n=5)")
    teacher = cells["tiny · Teacher"]
    # Fig. 4's teacher runs (seed 1000, other limits: KVPOP's scores) change none of these.
    assert [teacher[c] for c in columns] == ["1.00", "1.00", "0.00", "1.00", "0.75"]
    # Rel is a ratio, as the paper writes it (0.98, not 98%).
    assert teacher["Rel (n=5)"] == "1.00"
    row = cells["tiny · CR=75% · KVpop"]
    assert [row[c] for c in columns[:4]] == ["0.50", "1.00", "0.00", "0.00"]
    # 0.375 / 0.75; the traced run of the same row (FULL's scores) is not averaged in.
    assert row["Abs (n=5)"] == f"{(0.5 + 1 + 0 + 0) / 4:.2f}" and row["Rel (n=5)"] == "0.50"
    # the run at B = 200 fills nothing; the 88% row has no run at B = 48
    assert cells["tiny · CR=88% · KVpop"]["Abs (n=5)"] == NOT_RUN
    streaming = cells["tiny · CR=88% · StreamLLM"]
    assert streaming["Abs (n=5)"] == "0.00" and streaming["Rel (n=5)"] == "0.00"
    assert cells["tiny · CR=75% · StreamLLM"]["Abs (n=5)"] == NOT_RUN


@pytest.mark.parametrize(("preset", "scale"), [("kvpop_table1", "cpu"), ("kvpop_table2", "cluster")])
def test_preset_points_pair_rho_with_the_budget_and_rows_with_their_weights(preset, scale) -> None:
    budgets = {"cpu": {0.75: 96, 0.875: 48}, "cluster": {0.75: 4096, 0.875: 2048}}[scale]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for cr, rho in (("cr75", 0.75), ("cr88", 0.875)):
            base = [f"+experiment={preset}", f"scale={scale}", f"+experiment/kvpop/cr={cr}"]
            cfg = compose("config", overrides=[*base, "+experiment/kvpop/row=kvpop"])
            assert (cfg.rho, cfg.method.budget_tokens, cfg.method.count_state) == (rho, budgets[rho], True)
            model = cfg.model.name
            assert cfg.method.checkpoint == f"results/kvpop/{model}/kvpop_B{budgets[rho]}/policy.safetensors"
            assert cfg.model.path == cfg.method.weights == f"results/kvpop/{model}/kvpop_B{budgets[rho]}/model"
            plus = compose("config", overrides=[*base, "+experiment/kvpop/row=streaming_llm_plus"])
            assert plus.method.selection.budget_tokens == budgets[rho]
            assert plus.method.checkpoint == f"results/kvpop/{model}/streaming_llm_plus_B{budgets[rho]}/model/" + (
                "evictbench_finetune.json"
            )
            tova = compose("config", overrides=[*base, "+experiment/kvpop/row=tova_decode"])
            assert tova.method.name == "tova_decode" and tova.method.selection.budget_tokens == budgets[rho]
            full = compose("config", overrides=[*base, "+experiment/kvpop/row=full"])
            assert full.method.name == "full" and full.rho == 0.0


def timed_run(root: Path, method: dict, rho: float, seed: int, limit: int, **meta) -> str:
    """A run of one AIME example per limit's worth of tokens, with decode timings; returns its id."""
    folder = root / f"tiny__{method['name']}-aaaa{limit:04d}__aime-cccc{limit:04d}__rho{rho}__seed{seed}"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"method": method, "rho": rho, "seed": seed}))
    record = {
        "run_id": folder.name, "model": "tiny", "method": method["name"], "task": "aime", "rho": rho, "seed": seed,
        "subtask": "aime_2024", "example_id": "aime_2024/1/s0", "prediction": "x", "metrics": {"correct": 1.0},
        "new_tokens": limit, "decode_s": limit / 100, "decode_peak_bytes": 2**20 * limit,
        "identity": {"task": {"max_new_tokens": limit}}, "meta": meta,
    }  # fmt: skip
    (folder / "records.jsonl").write_text(json.dumps(record) + "\n")
    return folder.name


def test_figures_read_their_presets_runs_and_training_histories(tmp_path) -> None:
    from harness.analysis.figures import make_figures

    root, out = tmp_path / "results", tmp_path / "figures"
    full = {"_target_": "methods.full.FullCache", "name": "full"}
    # Fig. 4's runs: the teacher and KVpop at B = 96, timed under kvpop_fig4's seed at two limits.
    for limit in (64, 128):
        timed_run(root, full, 0.0, 1000, limit)
        timed_run(root, kvpop(96, 0.75), 0.75, 1000, limit)
    # Table 1's run of the teacher at seed 0 and its limit: not timed for Fig. 4, so not drawn in it.
    timed_run(root, full, 0.0, 0, 192)
    # Fig. 7's traced KVpop and DMS (recall per layer and head, the heads keeping each tail token).
    recall = {"recall_l0_h0": 0.5, "recall_l0_h1": 1.0, "recall_l1_h0": 0.25, "recall_l1_h1": 0.0, "recall": 0.44}
    pattern = {"pattern_positions": [5, 6], "pattern_heads": [[2, 0], [1, 1]], "pattern_tokens": ["a", "$x"]}
    traced = {"recall_queries": 16, "pattern_tail": 112}
    kvpop_run = timed_run(root, {**kvpop(96, 0.75), **traced}, 0.75, 0, 100, **recall, **pattern)
    dms = {**kvpop(96, 0.75), "_target_": "methods.dms.DMS", "name": "dms", "scorer_kind": "mlp", "count_state": False}
    dms_run = timed_run(root, {**dms, **traced}, 0.75, 0, 101, **recall, **pattern)
    # Another preset's full cache, decoded at batch 8: not Fig. 4's, so it neither joins nor mixes its timings.
    other = root / "tiny__full-aaaa0001__ruler-dddd0001__rho0__seed0"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump({"method": {"name": "full"}, "rho": 0.0}))
    (other / "records.jsonl").write_text(json.dumps({
        "run_id": other.name, "model": "tiny", "method": "full", "task": "ruler", "rho": 0.0, "seed": 0,
        "subtask": "niah_single_1", "example_id": "niah_single_1/512/0000", "prediction": "x",
        "metrics": {"string_match_all": 100.0}, "new_tokens": 999, "decode_s": 9.0, "meta": {"batch_size": 8},
    }) + "\n")  # fmt: skip
    for name in ("kvpop", "kvpop_immediate"):
        trained = root / "kvpop" / "tiny" / f"{name}_B96"
        trained.mkdir(parents=True)
        history = [{"step": 0, "token_accuracy": 0.1}, {"step": 10, "token_accuracy": 0.3}]
        config = {"name": name, "model": {"name": "tiny"}, "kvpop": {"budget": 96}}
        (trained / "training.json").write_text(json.dumps({"config": config, "history": history}))
    made = {path.name for path in make_figures(root, out) if path.name.startswith("kvpop")}
    assert made == {
        "kvpop_efficiency_tiny.png",
        "kvpop_delayed_tiny_B96.png",
        f"kvpop_pattern_{kvpop_run}.png",
        f"kvpop_pattern_{dms_run}.png",
        "kvpop_recall_tiny_kvpop[budget_tokens=96, pattern_tail=112, recall_queries=16]_rho0.75.png",
        "kvpop_recall_tiny_dms[budget_tokens=96, pattern_tail=112, recall_queries=16]_rho0.75.png",
        "kvpop_apph_dms_tiny_rho0.75.png",
    }
    assert all((out / name).stat().st_size > 0 for name in made)


def test_figure_4_draws_the_runs_its_preset_timed(tmp_path, monkeypatch) -> None:
    from harness.analysis.figures import kvpop as figures
    from harness.analysis.figures import make_figures

    root = tmp_path / "results"
    full = {"_target_": "methods.full.FullCache", "name": "full"}
    for limit in (64, 128):
        timed_run(root, full, 0.0, 1000, limit)
    timed_run(root, full, 0.0, 0, 100)  # Table 1's run: decoded during a benchmark sweep, not timed for Fig. 4
    drawn = []
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(fig) or path)
    make_figures(root, tmp_path / "figures")
    [latency] = [fig for fig in drawn if fig.axes[0].get_title().startswith("(a) latency")]
    [line] = latency.axes[0].get_lines()
    assert list(line.get_xdata()) == [64, 128]
