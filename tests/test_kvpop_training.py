"""The rows of KVpop's tables trained jointly with the base model: KVpop, DMS, StreamingLLM+ (tiny model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line
from hydra.utils import instantiate

from harness.config import compose_config
from harness.decode import kv_cache
from harness.decode.engine import Engine, Request
from harness.errors import UserError
from harness.models import ModelSpec, file_sha256, load_model
from harness.training.kvpop.train import train
from methods.dms import DMS
from methods.finetuned import read_finetune
from methods.kvpop import KVpop

# s = 2, w = 8, B = 40 on windows of 96 tokens; the tiny model's entries are 2 x 16 float32 numbers (128 bytes).
ROW = ("kvpop.sinks=2", "kvpop.window=8", "kvpop.budget=40", "kvpop.cell_dim=4", "data.length=96", "data.skip=0")
SHORT = ("data.windows=2", "data.heldout=1", "train.steps=3", "train.eval_every=3")


def row_config(recipe: str, output: Path, *overrides: str):
    return compose_config(
        "model=tiny_llama", f"kvpop_recipe={recipe}", *ROW, *SHORT, f"output={output}", *overrides,
        config_name="train_kvpop",
    )  # fmt: skip


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("rows")
    return {recipe: train(row_config(recipe, root / recipe)) for recipe in ("kvpop", "dms", "streaming_llm_plus")}


def fine_tuned(folder: str) -> torch.nn.Module:
    cfg = compose_config("model=tiny_llama", "model.source=hub", f"+model.path={folder}")
    return load_model(ModelSpec.from_config(cfg.model))


def test_kvpop_row_saves_model_policy_and_history(rows):
    summary = rows["kvpop"]
    folder = Path(summary["output"])
    # k = B - s - w less the mLSTM state: (4 x 8 + 8 + 1) float32 numbers = 164 bytes, 2 entries per head.
    assert summary["k"] == 40 - 2 - 8 - 2
    assert [point["step"] for point in summary["history"]] == [0, 3]
    last = summary["history"][-1]
    assert {"token_accuracy", "kl", "score_loss", "recall", "gamma"} <= set(last)
    assert 0.0 <= last["token_accuracy"] <= 1.0 and last["kl"] >= 0.0
    record = read_finetune(summary["model"])
    assert (record.pattern, record.sinks, record.window, record.budget) == ("kvpop", 2, 8, 40)
    assert record.policy == summary["policy"] == str(folder / "policy.safetensors")
    assert record.weights_sha256 == file_sha256(folder / "model" / "model.safetensors")
    assert json.loads((folder / "training.json").read_text())["k"] == 28


def test_kvpop_policy_runs_on_its_weights_at_the_trained_budget(rows):
    summary = rows["kvpop"]
    method = KVpop(checkpoint=summary["policy"], weights=summary["model"], budget_tokens=40, count_state=True)
    assert method.trained.base_model == summary["model"]
    assert (method.sinks, method.window, method.net.delay, method.net.readout_kind) == (2, 8, 8, "silu")
    assert method.net.gamma_space == "log" and method.net.cell_dim == 4
    lengths = []
    engine = Engine(
        fine_tuned(summary["model"]),
        method,
        on_step=lambda step, context, cache: lengths.append(kv_cache.cache_lengths(cache)),
    )
    result = engine.generate(Request(list(range(100, 160)), 16))
    assert result.budget == 38 and lengths[-1] == [38, 38, 38]
    with pytest.raises(ValueError, match=re.escape("was trained jointly with the base model fine-tuned in")) as raised:
        KVpop(checkpoint=summary["policy"], weights="elsewhere", budget_tokens=40)
    assert_one_line(str(raised.value))
    assert str(raised.value).endswith(f"— run with model.source=hub model.path={summary['model']}")


def test_dms_row_trains_gates_that_only_dms_serves(rows):
    summary = rows["dms"]
    last = summary["history"][-1]
    assert 0.0 <= last["evict_rate"] <= 1.0
    # the target 1 - k / (S - s - w), k = 40 - 2 - 8, rises over anneal_steps = 3: the mean of 1/3, 2/3, 1 of it
    assert last["evict_target"] == pytest.approx(2 / 3 * (1 - 30 / (96 - 2 - 8)))
    method = DMS(checkpoint=summary["policy"], weights=summary["model"], budget_tokens=40)
    assert method.budget_for(60) == 40 and float(method.net.log_gamma().detach().abs().max()) == 0.0
    with pytest.raises(
        ValueError, match=re.escape("holds a policy trained by the dms objective, not kvpop's")
    ) as raised:
        KVpop(checkpoint=summary["policy"], weights=summary["model"], budget_tokens=40)
    assert_one_line(str(raised.value))
    with pytest.raises(ValueError, match="holds a policy trained by the kvpop objective, not dms's"):
        DMS(checkpoint=rows["kvpop"]["policy"], weights=rows["kvpop"]["model"], budget_tokens=40)


def test_streaming_llm_plus_reads_the_record_of_its_weights(rows):
    summary = rows["streaming_llm_plus"]
    assert summary["policy"] is None and [p["step"] for p in summary["history"]] == [0, 3]
    record = read_finetune(summary["model"])
    # StreamingLLM keeps the sinks and B - s recent entries as its window
    assert (record.pattern, record.sinks, record.window, record.budget) == ("streaming", 2, 38, 40)

    def method(*overrides: str):
        cfg = compose_config("method=streaming_llm_plus", "model=tiny_llama", *overrides)
        return instantiate(cfg.method)

    plus = method(f"+model.path={summary['model']}", "method.selection.sinks=2", "method.selection.budget_tokens=40")
    assert plus.selection.budget_tokens == 40
    for overrides, named in (
        (("method.selection.sinks=4",), "was fine-tuned with 2 sinks but method.selection.sinks=4 — use"),
        (("method.selection.sinks=2", "method.selection.budget_tokens=48"), "for a budget of 40 entries but"),
    ):
        with pytest.raises(Exception, match=re.escape(named)):
            method(f"+model.path={summary['model']}", *overrides)
    with pytest.raises(Exception, match="fine-tuned under the kvpop pattern, not the streaming pattern"):
        method(f"+model.path={rows['kvpop']['model']}", "method.selection.sinks=2")
    with pytest.raises(Exception, match="needs a base model fine-tuned under its pattern"):
        method()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("recipe=joint2",), "recipe='joint2' is not a recipe — pick a row with kvpop_recipe=<name>"),
        (("train.loss=mse",), "train.loss='mse' is not a loss — use boundary (Eq. 7) or cutoff"),
        (("kvpop.bucket=4",), "kvpop.bucket=4 with recipe=joint — the training pattern needs static priorities"),
        (("kvpop.budget=120",), "the budget binds from position"),
    ],
)
def test_bad_training_options_are_one_line(tmp_path, overrides, named):
    with pytest.raises(UserError, match=re.escape(named)) as raised:
        train(row_config("kvpop", tmp_path / "row", *overrides))
    assert_one_line(str(raised.value))


def test_the_paper_scale_recipe_composes_with_the_papers_settings():
    from harness.training.kvpop.train import make_scorer, trained_k

    cfg = compose_config("kvpop_scale=cluster", "model=qwen3_8b", "kvpop_recipe=kvpop", config_name="train_kvpop")
    assert (cfg.model.name, cfg.kvpop.budget, cfg.data.length, cfg.data.packing) == ("qwen3_8b", 4096, 16384, True)
    assert (cfg.train.steps, cfg.train.lr, cfg.train.base_lr, cfg.recipe) == (2000, 1e-3, 8e-5, "joint")
    assert cfg.data.hub.path == "nvidia/Nemotron-Math-v2" and cfg.data.hub.revision is None  # pinned by the user
    assert cfg.output == "results/kvpop/qwen3_8b/kvpop_B4096"
    # Qwen3-8B: 36 layers, 8 KV heads of 128; the mLSTM cell is d/2 = 64 wide, its state 64 x 128 + 128 + 1
    # float32 numbers (33,284 bytes) costs 66 bfloat16 entries of 512 bytes, which k gives up.
    scorer = make_scorer(cfg.kvpop, 36, 8, 128)
    assert (scorer.cell_dim, scorer.delay, scorer.readout_kind, scorer.gamma_space) == (64, 256, "silu", "log")
    assert trained_k(cfg.kvpop, scorer, torch.bfloat16) == 4096 - 4 - 256 - 66


def test_eval_script_names_each_trained_row_apart() -> None:
    from kvpop_eval import checkpoint_name

    # Every row's policy file is called policy.safetensors: the row's folder tells them apart.
    rows = [f"results/kvpop/smollm2_135m/{row}_B96/policy.safetensors" for row in ("kvpop", "kvpop_immediate")]
    assert [checkpoint_name(path) for path in rows] == ["kvpop_B96/policy", "kvpop_immediate_B96/policy"]
    assert checkpoint_name("policy.safetensors") == "policy"
