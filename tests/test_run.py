"""``python -m harness.run`` end to end on a tiny model: run ids, records, resumption, errors."""

from __future__ import annotations

import json

import pytest
from hydra.errors import MissingConfigException

from harness import run as harness_run
from harness.config import compose_config
from harness.report import runs_table
from harness.run import execute, run_id
from tasks.ruler.task import RulerTask

TINY = ("model=tiny_llama", "task.lengths=[512]", "task.n=2", "threads=1")

RECORD_FIELDS = {
    "run_id", "model", "method", "task", "subtask", "rho", "seed", "example_id", "prediction", "answers",
    "metrics", "prefill_len", "budget", "cache_len_final", "kv_bytes_final", "kv_bytes_full", "prefill_s",
    "decode_s", "new_tokens", "decode_tokens_per_s", "score_s", "evict_s", "meta",
}  # fmt: skip


def test_run_writes_records_and_resumes(tmp_path, monkeypatch):
    cfg = compose_config(*TINY, "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    summary = execute(cfg)
    folder = tmp_path / summary["run_id"]
    lines = (folder / "records.jsonl").read_text().splitlines()
    assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["budget"] == r["prefill_len"] // 2
        assert r["cache_len_final"] == r["budget"]
        assert r["kv_bytes_final"] < r["kv_bytes_full"]
        assert set(r["metrics"]) == {"string_match_all"}
    assert [r["example_id"] for r in records] == ["niah_single_1/512/0000", "niah_single_1/512/0001"]
    assert summary["n"] == 2 and "niah_single_1" in summary["subtasks"]
    assert json.loads((folder / "summary.json").read_text())["n"] == 2
    assert (folder / "config.yaml").read_text().count("rho: 0.5") >= 1
    provenance = json.loads((folder / "provenance.jsonl").read_text().splitlines()[0])
    assert {"git_commit", "packages", "device"} <= set(provenance)

    # Same config: nothing to run, so the model is never even loaded.
    def no_model(spec):
        raise AssertionError("a complete run must not load the model again")

    monkeypatch.setattr(harness_run, "load_model", no_model)
    assert execute(cfg)["n"] == 2
    monkeypatch.undo()
    # Widening the example set resumes into the same folder and runs only the new example.
    wider = compose_config(*TINY[:-2], "task.n=3", "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    assert execute(wider)["run_id"] == summary["run_id"]
    assert len((folder / "records.jsonl").read_text().splitlines()) == 3
    row = runs_table(tmp_path)[["model", "method", "task", "rho", "n"]].values.tolist()
    assert row == [["tiny_llama", "inertia", "ruler", 0.5, 3]]


def test_run_id_follows_the_config_not_the_clock():
    base = compose_config("method=inertia", "rho=0.9")
    task = RulerTask()
    assert run_id(base, task) == run_id(compose_config("method=inertia", "rho=0.9"), task)
    assert run_id(base, task).startswith("smollm2_135m__inertia-")
    assert run_id(base, task).endswith("__rho0.9__seed0")
    changed = compose_config("method=inertia", "rho=0.9", "method.aggregator.alpha=0.5")
    assert run_id(changed, task) != run_id(base, task)
    assert run_id(compose_config("method=inertia", "method/scorer=vnorm"), task) != run_id(base, task)
    sampled = compose_config("method=inertia", "sampling.temperature=0.7")
    assert run_id(sampled, task) != run_id(base, task)


@pytest.mark.parametrize("rho", ["1.0", "-0.1", "1.5"])
def test_rho_outside_range_is_refused(rho, tmp_path):
    cfg = compose_config(*TINY, "method=inertia", f"rho={rho}", f"results_dir={tmp_path}")
    with pytest.raises(ValueError, match=rf"rho={rho} is outside \[0, 1\)"):
        execute(cfg)


def test_budget_below_window_fails_before_any_generation(tmp_path):
    cfg = compose_config(*TINY, "method=snapkv", "rho=0.95", f"results_dir={tmp_path}")
    with pytest.raises(ValueError, match=r"smaller than sinks\+window=0\+32"):
        execute(cfg)
    assert not list(tmp_path.glob("*/records.jsonl")) or all(
        p.read_text() == "" for p in tmp_path.glob("*/records.jsonl")
    )


@pytest.mark.parametrize(("group", "bad"), [("method", "tovaa"), ("model", "llama9"), ("task", "rulerr")])
def test_unknown_names_list_the_choices(group, bad):
    with pytest.raises(MissingConfigException) as error:
        compose_config(f"{group}={bad}")
    message = str(error.value)
    assert bad in message
    expected = {"method": "inertia_lazy", "model": "smollm2_135m", "task": "ruler"}[group]
    assert expected in message


def test_model_free_task_runs_through_the_harness(tmp_path):
    overrides = ("task=dialogs", "task.n_dialogs=2", "task.scenarios=[topic_shift]", f"results_dir={tmp_path}")
    summary = execute(compose_config(*overrides, "method=fdkvc"))
    assert summary["run_id"].startswith("world__fdkvc-")
    assert summary["n"] == 2 and summary["primary_metric"] == "alignment"
    records = [json.loads(line) for line in (tmp_path / summary["run_id"] / "records.jsonl").read_text().splitlines()]
    for record in records:
        assert record["model"] == "world"
        assert record["budget"] == 56 and record["cache_len_final"] <= 56
        assert len(record["meta"]["turns"]["alignment"]) == 10


def test_diagnostics_are_written_per_example(tmp_path):
    cfg = compose_config(*TINY, "method=inertia", "rho=0.5", f"results_dir={tmp_path}", "diagnostics=true")
    summary = execute(cfg)
    lines = (tmp_path / summary["run_id"] / "diagnostics.jsonl").read_text().splitlines()
    assert [json.loads(line)["example_id"] for line in lines] == ["niah_single_1/512/0000", "niah_single_1/512/0001"]
