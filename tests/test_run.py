"""``python -m harness.run`` end to end on a tiny model: run ids, records, resumption, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from hydra.errors import MissingConfigException
from hydra.utils import instantiate

from harness import run as harness_run
from harness.analysis.report import runs_table
from harness.config import compose_config
from harness.errors import UserError
from harness.models import ModelSpec
from harness.record.identity import identify, run_id
from harness.record.schema import RECORD_FIELDS, RunId
from harness.run import execute
from methods.kvpop import CheckpointInfo, build_scorer, save_checkpoint

TINY = ("model=tiny_llama", "task.lengths=[512]", "task.n=2", "threads=1")


def records_of(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def test_run_writes_records_and_resumes(tmp_path, monkeypatch):
    cfg = compose_config(*TINY, "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    summary = execute(cfg)
    folder = tmp_path / summary["run_id"]
    records = records_of(folder)
    assert len(records) == 2
    for r in records:
        assert list(r) == list(RECORD_FIELDS)
        assert r["budget"] == r["prefill_len"] // 2
        assert r["cache_len_final"] == r["budget"]
        assert r["kv_bytes_final"] < r["kv_bytes_full"]
        # The buffers hold the budget's entries and the one free slot a step writes into.
        assert r["slot_bytes_final"] == r["kv_bytes_final"] // r["budget"] * (r["budget"] + 1)
        assert set(r["metrics"]) == {"string_match_all"}
        assert r["identity"]["model"]["dtype"] == "float32" and r["identity"]["model"]["device"] == "cpu"
        assert r["identity"]["method"]["aggregator"]["alpha"] == 0.8
        assert r["identity"]["task"] == instantiate(cfg.task).identity()
    assert [r["example_id"] for r in records] == ["niah_single_1/512/0000", "niah_single_1/512/0001"]
    assert summary["n"] == 2 and "niah_single_1" in summary["subtasks"]
    assert json.loads((folder / "summary.json").read_text())["n"] == 2
    assert (folder / "config.yaml").read_text().count("rho: 0.5") >= 1
    provenance = json.loads((folder / "provenance.jsonl").read_text().splitlines()[0])
    assert {"git_commit", "packages", "device", "identity", "run_id"} <= set(provenance)
    assert provenance["identity"] == records[0]["identity"]

    # Same config: nothing to run, so the model is never even loaded.
    def no_model(spec):
        raise AssertionError("a complete run must not load the model again")

    monkeypatch.setattr(harness_run, "load_model", no_model)
    assert execute(cfg)["n"] == 2
    monkeypatch.undo()
    # Widening the example set resumes into the same folder and runs only the new example.
    wider = compose_config(*TINY[:-2], "task.n=3", "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    assert execute(wider)["run_id"] == summary["run_id"]
    assert len(records_of(folder)) == 3
    row = runs_table(tmp_path)[["model", "method", "task", "rho", "n"]].values.tolist()
    assert row == [["tiny_llama", "inertia", "ruler", 0.5, 3]]


def rid(*overrides: str) -> str:
    cfg = compose_config(*overrides)
    return run_id(cfg, instantiate(cfg.task))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("method=inertia", "rho=0.9"), "smollm2_135m__inertia-a5651405__ruler-ae427061__rho0.9__seed0"),
        (
            ("model=tiny_llama", "method=tova_decode", "rho=0.5", "task.lengths=[512]"),
            "tiny_llama__tova_decode-3eff8542__ruler-ae427061__rho0.5__seed0",
        ),
        (("task=dialogs", "method=h2o"), "world__h2o-0a85d09e__dialogs-6b8c5589__rho0.9__seed0"),
        (("method=h2o", "task=needle"), "smollm2_135m__h2o-0a85d09e__needle-c380edc6__rho0.9__seed0"),
        (("sampling.temperature=0.7",), "smollm2_135m__inertia-a5651405__ruler-0b788a4e__rho0.9__seed0"),
    ],
)
def test_run_ids_of_unchanged_configs_stay_what_schema_version_3_made_them(overrides, expected, monkeypatch):
    # The preset run on a CPU in float32. A change here moves every run of that config to a new folder:
    # it needs a schema version and a migration (harness.record.migrate), not an edit of this table.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rid(*overrides) == expected


def test_rho_is_in_the_run_id_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    low, high = RunId.parse(rid("method=inertia", "rho=0.5")), RunId.parse(rid("method=inertia", "rho=0.9"))
    assert (low.rho, high.rho) == ("0.5", "0.9") and low.method_params == high.method_params
    cfg = compose_config("model=tiny_llama", "method=kvpop", "rho=0.5")
    assert "rho" not in json.dumps(identify(cfg, instantiate(cfg.task), ModelSpec.from_config(cfg.model))[1].method)


def test_run_id_covers_everything_that_changes_outputs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = ("model=tiny_llama", "method=inertia")
    variants = {
        "base": rid(*base),
        "bf16": rid(*base, "model.dtype=bfloat16"),
        "layers": rid(*base, "model.config.num_hidden_layers=2"),
        "positions": rid(*base, "model.config.max_position_embeddings=4096"),
        "weights": rid(*base, "model.seed=1"),
        "cuda": rid(*base, "model.dtype=auto", "model.device=cuda"),
        "alpha": rid(*base, "method.aggregator.alpha=0.5"),
        "scorer": rid(*base, "method/scorer=vnorm"),
        "diagnostics": rid(*base, "diagnostics=true"),
        "sampled": rid(*base, "sampling.temperature=0.7"),
        "protocol": rid(*base, "task.chat_template=false"),
        "seed": rid(*base, "seed=1"),
    }
    assert len(set(variants.values())) == len(variants)
    # Only what differs from the preset enters the model part, so it names the variant.
    assert RunId.parse(variants["base"]).model_params is None
    assert RunId.parse(variants["bf16"]).model == "tiny_llama"
    assert RunId.parse(variants["bf16"]).model_params is not None
    # A CPU run resumed on a GPU (bf16 by default there) goes to another folder.
    on_cpu = rid("method=inertia")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert RunId.parse(rid("method=inertia")).model_params is not None
    assert rid("method=inertia") != on_cpu
    # Selecting which examples run is not part of the identity.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rid(*base, "task.n=50", "task.lengths=[4096]") == variants["base"]


def tiny_checkpoint(path, seed: int) -> str:
    torch.manual_seed(seed)
    scorer = build_scorer("mlp", 3, 2, 16, gamma_min=0.999, gamma_max=1.0, hidden=8)
    info = CheckpointInfo(
        "tiny_llama", 3, 2, 16, scorer.hyperparameters(), {"sinks": 4, "window": 8, "k": 16, "bucket": 1}
    )
    return str(save_checkpoint(scorer, path, info))


def test_a_retrained_checkpoint_at_the_same_path_is_another_run(tmp_path):
    path = tmp_path / "scorer.safetensors"
    overrides = ("model=tiny_llama", "method=kvpop_mlp", f"method.checkpoint={path}")
    tiny_checkpoint(path, seed=0)
    first = rid(*overrides)
    assert rid(*overrides) == first
    tiny_checkpoint(path, seed=1)
    assert rid(*overrides) != first


def test_dtype_runs_never_share_a_folder(tmp_path):
    common = (*TINY[:-2], "task.n=1", "method=tova", "rho=0.5", f"results_dir={tmp_path}")
    fp32 = execute(compose_config(*common))["run_id"]
    bf16 = execute(compose_config(*common, "model.dtype=bfloat16"))["run_id"]
    assert fp32 != bf16
    assert [r["identity"]["model"]["dtype"] for r in records_of(tmp_path / fp32)] == ["float32"]
    assert [r["identity"]["model"]["dtype"] for r in records_of(tmp_path / bf16)] == ["bfloat16"]


def test_records_of_an_edited_preset_are_not_extended(tmp_path):
    cfg = compose_config(*TINY[:-2], "task.n=1", "method=tova", "rho=0.5", f"results_dir={tmp_path}")
    folder = tmp_path / execute(cfg)["run_id"]
    lines = records_of(folder)
    lines[0]["identity"]["model"]["config"]["hidden_size"] = 32
    (folder / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    wider = compose_config(*TINY[:-2], "task.n=2", "method=tova", "rho=0.5", f"results_dir={tmp_path}")
    with pytest.raises(UserError, match=r"made with model\.config\.hidden_size=32, this config has 64 .* move"):
        execute(wider)
    assert len(records_of(folder)) == 1


@pytest.mark.parametrize("rho", ["1.0", "-0.1", "1.5"])
def test_rho_outside_range_is_refused(rho, tmp_path):
    cfg = compose_config(*TINY, "method=inertia", f"rho={rho}", f"results_dir={tmp_path}")
    with pytest.raises(UserError, match=rf"rho={rho} is outside \[0, 1\) — "):
        execute(cfg)


def test_refusals_come_before_the_model_loads_and_leave_no_folder(tmp_path, monkeypatch):
    def no_model(spec):
        raise AssertionError("a refused run must not load the model")

    monkeypatch.setattr(harness_run, "load_model", no_model)
    refused = {
        r"smaller than sinks\+window=0\+32=32 — lower rho": ("method=snapkv", "rho=0.95"),
        r"budget_tokens=8\) is smaller than .* — raise method.selection.budget_tokens": (
            "method=snapkv",
            "method.selection.budget_tokens=8",
        ),
        r"exceed the model's 256 positions — use shorter prompts": (
            "method=tova",
            "model.config.max_position_embeddings=256",
        ),
        r"sliding_attention layers .* — set model.config.sliding_window=null": (
            "model=tiny_mistral",
            "model.config.sliding_window=64",
        ),
    }
    for message, overrides in refused.items():
        cfg = compose_config(*TINY, *overrides, f"results_dir={tmp_path}")
        with pytest.raises(UserError, match=message):
            execute(cfg)
    assert list(tmp_path.iterdir()) == []


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
    for record in records_of(tmp_path / summary["run_id"]):
        assert record["model"] == "world" and record["identity"]["model"] == {}
        assert record["budget"] == 56 and record["cache_len_final"] <= 56
        assert len(record["meta"]["turns"]["alignment"]) == 10


def test_diagnostics_are_written_per_example_in_their_own_run(tmp_path):
    overrides = (*TINY, "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    plain = execute(compose_config(*overrides))["run_id"]
    traced = execute(compose_config(*overrides, "diagnostics=true"))["run_id"]
    assert traced != plain and not (tmp_path / plain / "diagnostics.jsonl").exists()
    lines = (tmp_path / traced / "diagnostics.jsonl").read_text().splitlines()
    assert [json.loads(line)["example_id"] for line in lines] == ["niah_single_1/512/0000", "niah_single_1/512/0001"]


def test_a_profiled_run_times_the_method_apart_in_its_own_run(tmp_path):
    overrides = (*TINY, "method=inertia", "rho=0.5", f"results_dir={tmp_path}")
    plain = execute(compose_config(*overrides))["run_id"]
    profiled = execute(compose_config(*overrides, "profile=true"))["run_id"]
    assert profiled != plain
    shares = [(r["score_s"], r["evict_s"]) for r in records_of(tmp_path / plain)]
    assert shares == [(None, None)] * 2
    for record, again in zip(records_of(tmp_path / profiled), records_of(tmp_path / plain), strict=True):
        assert record["score_s"] > 0 and record["evict_s"] >= 0 and record["identity"]["method"]["profile"] is True
        assert record["prediction"] == again["prediction"] and record["kv_entries_held"] == again["kv_entries_held"]
