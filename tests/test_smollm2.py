"""The real model (SmolLM2-135M-Instruct from its packaged GGUF): the CI smoke test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import NAMED_METHODS, named_method

from harness.config import compose_config
from harness.decode.engine import Engine, Request
from harness.run import execute
from tasks.ruler.task import RulerTask


def chat_prompt(tokenizer) -> list[int]:
    messages = [{"role": "user", "content": "List three colours of the rainbow, then count from one to ten."}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_no_eviction_matches_generate_on_smollm2(smollm2):
    model, tokenizer = smollm2
    ids = chat_prompt(tokenizer)
    model.set_attn_implementation("sdpa")
    expected = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids) :].tolist()
    for name in NAMED_METHODS:
        tokens = Engine(model, named_method(name, "rho=0")).generate(Request(ids, 20, stop_token_ids={2})).tokens
        assert tokens == expected, name


def test_harness_run_on_smollm2_retrieves_the_needle(tmp_path):
    base = ("task.lengths=[1024]", "task.n=2", f"results_dir={tmp_path}")
    full = execute(compose_config(*base, "method=full"))
    inertia = execute(compose_config(*base, "method=inertia", "rho=0.9"))
    assert full["n"] == inertia["n"] == 2
    # Measured: SmolLM2 retrieves the 7-digit value in these prompts with the full cache and
    # with InertiaKV at 10% of the prompt cache.
    assert full["overall"] == 100.0
    assert inertia["overall"] == 100.0
    assert inertia["kv_ratio_final"] < 0.12
    records = [json.loads(x) for x in (tmp_path / inertia["run_id"] / "records.jsonl").read_text().splitlines()]
    for record in records:
        assert record["budget"] == int(0.1 * record["prefill_len"] + 1e-9)
        assert record["answers"][0] in record["prediction"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tova", "h2o", "inertia_lazy", "score_free", "snapkv", "streaming_llm"])
def test_other_methods_run_on_smollm2(tmp_path, method):
    summary = execute(compose_config("task.lengths=[1024]", "task.n=2", f"results_dir={tmp_path}", f"method={method}"))
    assert summary["n"] == 2


SMOLLM2_BATCHED = ["full", "inertia", "h2o", "adakv_ea", "kvzip"]
# Trained methods (kvpop*, dms, bilinear, streaming_llm_plus) need a checkpoint of SmolLM2's geometry;
# tests/test_batching.py runs every method, those included, on the tiny models.
UNTRAINED = sorted(
    path.stem
    for path in (Path(__file__).parents[1] / "conf" / "method").glob("*.yaml")
    if not path.stem.startswith(("kvpop", "dms", "bilinear", "streaming_llm_plus"))
)


def batched_matches_alone(smollm2, name: str) -> None:
    model, tokenizer = smollm2
    examples = RulerTask(tasks=["niah_single_1", "niah_multikey_1"], lengths=[512], n=2).examples(tokenizer)
    requests = [Request(example.input_ids, 16, stop_token_ids={2}) for example in examples]
    method = named_method(name, "rho=0.9", *(["method.selection.budget_tokens=48"] * (name == "fixed_budget")))
    engine = Engine(model, method, tokenizer=tokenizer)
    alone = [engine.generate(request) for request in requests]
    batched = dict(engine.generate_batch(enumerate(requests), 3))
    for index, generation in enumerate(alone):
        assert generation.tokens == batched[index].tokens, f"{name}: sequence {index}"
        assert generation.kv_bytes_final == batched[index].kv_bytes_final, f"{name}: sequence {index}"


@pytest.mark.parametrize("name", SMOLLM2_BATCHED)
def test_batched_decoding_gives_batch_ones_tokens_on_smollm2(smollm2, name):
    batched_matches_alone(smollm2, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in UNTRAINED if name not in SMOLLM2_BATCHED])
def test_batched_decoding_of_every_other_method_on_smollm2(smollm2, name):
    batched_matches_alone(smollm2, name)
