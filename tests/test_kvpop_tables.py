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


def write_run(root: Path, method: dict, rho: float, rows: list[tuple[str, str, int]], tag: str) -> None:
    for task in ("aime", "hmmt"):
        run_id = f"tiny__{method['name']}-{tag}__{task}-cccc0001__rho{rho}__seed0"
        folder = root / run_id
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump({"method": method, "rho": rho}))
        records = [
            {"run_id": run_id, "model": "tiny", "method": method["name"], "task": task, "rho": rho, "seed": 0,
             "subtask": competition, "example_id": f"{competition}/{problem}/s0", "prediction": "x",
             "metrics": {"correct": float(correct)}, "meta": {"problem_id": problem}}
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
    frame = annotate(load_results(root), load_configs(root))
    spec = next(s for s in paper_tables() if s.key == "kvpop_table1")
    header, body = grid(spec, frame)
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in body}


def test_table1_has_the_papers_columns_and_rows(cells) -> None:
    assert list(cells["tiny · Teacher"]) == ["AIME 2024", "AIME 2025", "HMMT 2502", "HMMT 2511", "Abs", "Rel"]
    labels = [label.removeprefix("tiny · ") for label in cells]
    assert labels[:8] == ["Teacher", "CR=75% · StreamLLM", "CR=75% · TOVA", "CR=75% · StreamLLM+", "CR=75% · DMS",
                          "CR=75% · KVpop mlp", "CR=75% · KVpop", "CR=75% · KVpop (no delay)"]  # fmt: skip
    assert len(labels) == 1 + 2 * 7


def test_cells_are_pass_at_1_per_competition_their_average_and_the_ratio(cells) -> None:
    teacher = cells["tiny · Teacher"]
    assert [teacher[c] for c in ("AIME 2024", "AIME 2025", "HMMT 2502", "HMMT 2511", "Abs")] == [
        "1.00", "1.00", "0.00", "1.00", "0.75"
    ]  # fmt: skip
    assert teacher["Rel"] == "100%"
    row = cells["tiny · CR=75% · KVpop"]
    assert [row[c] for c in ("AIME 2024", "AIME 2025", "HMMT 2502", "HMMT 2511")] == ["0.50", "1.00", "0.00", "0.00"]
    assert row["Abs"] == f"{(0.5 + 1 + 0 + 0) / 4:.2f}" and row["Rel"] == "50%"  # 0.375 / 0.75
    # the run at B = 200 fills nothing; the 88% row has no run at B = 48
    assert cells["tiny · CR=88% · KVpop"]["Abs"] == NOT_RUN
    streaming = cells["tiny · CR=88% · StreamLLM"]
    assert streaming["Abs"] == "0.00" and streaming["Rel"] == "0%"
    assert cells["tiny · CR=75% · StreamLLM"]["Abs"] == NOT_RUN


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


def test_figures_draw_from_records_and_training_histories(tmp_path) -> None:
    from harness.analysis.figures import kvpop as figures

    root, out = tmp_path / "results", tmp_path / "figures"
    out.mkdir()
    for name, tag in (("full", "aaaa0001"), ("kvpop", "aaaa0002")):
        folder = root / f"tiny__{name}-{tag}__aime-cccc0001__rho0.75__seed0"
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(yaml.safe_dump({"method": {"name": name}, "rho": 0.75}))
        meta = {"recall_l0_h0": 0.5, "recall_l0_h1": 1.0, "recall_l1_h0": 0.25, "recall_l1_h1": 0.0, "recall": 0.44}
        if name == "kvpop":
            meta |= {"pattern_positions": [5, 6], "pattern_heads": [[2, 0], [1, 1]], "pattern_tokens": ["a", "$x"]}
        records = [
            {"run_id": folder.name, "model": "tiny", "method": name, "task": "aime", "rho": 0.75, "seed": 0,
             "subtask": "aime_2024", "example_id": f"aime_2024/{i}/s0", "prediction": "x", "metrics": {"correct": 1.0},
             "new_tokens": 16 * (i + 1), "decode_s": 0.1 * (i + 1), "decode_peak_bytes": 2**20 * (i + 1),
             "meta": meta if name == "kvpop" else {}}
            for i in range(2)
        ]  # fmt: skip
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
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
    frame = annotate(load_results(root), load_configs(root))
    made = {path.name for figure in figures.FIGURES.values() for path in figure(frame, root, out)}
    assert made == {
        "kvpop_efficiency_tiny.png",
        "kvpop_delayed_tiny_B96.png",
        "kvpop_pattern_tiny__kvpop-aaaa0002__aime-cccc0001__rho0.75__seed0.png",
        "kvpop_recall_tiny_kvpop_rho0.75.png",
    }
    assert all((out / name).stat().st_size > 0 for name in made)
