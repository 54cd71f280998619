"""Batched decoding (``Engine.generate_batch``, ``batch_size=``): every figure but the timings is batch 1's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODELS, named_method, refused
from test_kvpop import tiny_checkpoint

from harness.config import compose_config, model_spec
from harness.decode.engine import Engine, Generation, Request
from harness.decode.sampling import Sampling
from harness.errors import UserError
from harness.models import load_tokenizer
from harness.run import execute, prepare
from methods.kvpop import CheckpointInfo, build_scorer, save_checkpoint
from methods.scorers.bilinear import BilinearHead, BilinearInfo, save_bilinear

METHODS = sorted(path.stem for path in (Path(__file__).parents[1] / "conf" / "method").glob("*.yaml"))
# StreamingLLM+ serves StreamingLLM's pattern on fine-tuned weights: its inference is streaming_llm's,
# and its weights need a training run (tests/test_kvpop_training.py).
BATCHED = [name for name in METHODS if name != "streaming_llm_plus"]
TIMINGS = {"prefill_s", "decode_s", "score_s", "evict_s", "prefill_score_s"}


def figures(generation: Generation) -> dict:
    """Everything a record takes from a generation but its timings; log-probabilities to float rounding.

    A matrix product over several batch rows sums in another order than over one (MKL blocks rows
    by four): logits differ in the last bits, so teacher-forced log-probabilities agree to ~1e-6.
    """
    out = {k: v for k, v in dataclasses.asdict(generation).items() if k not in TIMINGS}
    out["target_logprobs"] = [pytest.approx(value, abs=1e-5) for value in out["target_logprobs"]]
    return out


def prompts(count: int = 5) -> list[list[int]]:
    lengths = (64, 96, 80, 120, 72, 88, 104, 60)[:count]
    return [torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in lengths]


def dms_checkpoint(folder: Path) -> str:
    torch.manual_seed(2)
    scorer = build_scorer("mlp", 3, 2, 16, gamma_min=1.0, gamma_max=1.0, hidden=8)
    info = CheckpointInfo(
        "tiny_llama", 3, 2, 16, scorer.hyperparameters(), {"sinks": 2, "window": 8, "k": 30, "bucket": 1}, {}, "dms"
    )
    return str(save_checkpoint(scorer, folder / "dms.safetensors", info))


def extra_overrides(name: str, model, folder: Path) -> list[str]:
    """What a method needs beyond its preset on tiny_llama: a random checkpoint of the model's geometry, a
    budget below these prompts."""
    if name.startswith("kvpop"):
        return [f"method.checkpoint={tiny_checkpoint(folder, 'mlp' if name == 'kvpop_mlp' else 'mlstm')}"]
    if name == "fixed_budget":
        return ["method.selection.budget_tokens=40"]
    if name == "dms":
        return [f"method.checkpoint={dms_checkpoint(folder)}"]
    if name == "bilinear":
        config = model.config
        info = BilinearInfo("tiny_llama", config.num_hidden_layers, config.num_attention_heads,
                            config.num_key_value_heads, config.head_dim, 8, per_layer=False)  # fmt: skip
        head = folder / "head.safetensors"
        save_bilinear(
            BilinearHead(1, info.query_heads * info.head_dim, info.kv_heads * info.head_dim, 8), str(head), info
        )
        return [f"method.scorer.checkpoint={head}"]
    return []


def alone_and_batched(engine: Engine, requests: list[Request], batch_size: int) -> tuple[list, dict]:
    alone = [engine.generate(request) for request in requests]
    batched = dict(engine.generate_batch(enumerate(requests), batch_size))
    return alone, batched


@pytest.mark.parametrize("name", BATCHED)
def test_every_method_batched_gives_the_records_of_batch_one(tiny_models, tmp_path, name):
    """Five sequences of different lengths, three decoding together (two join as others finish)."""
    model = tiny_models["tiny_llama"]
    method = named_method(name, "rho=0.5", "model=tiny_llama", *extra_overrides(name, model, tmp_path))
    engine = Engine(model, method, tokenizer=load_tokenizer(model_spec("tiny_llama")))
    requests = [Request(ids, 14 + 3 * i, seed=i) for i, ids in enumerate(prompts())]
    alone, batched = alone_and_batched(engine, requests, 3)
    assert sorted(batched) == list(range(len(requests)))
    for index, generation in enumerate(alone):
        assert generation.tokens == batched[index].tokens, f"{name}: sequence {index} diverged in the batch"
        assert figures(generation) == figures(batched[index]), f"{name}: sequence {index}"
    seen = [generation.prefill_len + len(generation.tokens) - 1 for generation in alone]
    evicted = any(g.kv_entries_final < total for g, total in zip(alone, seen, strict=True))
    assert evicted == (name != "full"), name


@pytest.mark.parametrize("model_name", TINY_MODELS)
@pytest.mark.parametrize("name", ["full", "inertia", "tova", "h2o", "adakv_ea", "snapkv", "fdkvc"])
def test_families_batched_on_every_tiny_model(tiny_models, model_name, name):
    engine = Engine(tiny_models[model_name], named_method(name, "rho=0.5"))
    requests = [Request(ids, 12 + 2 * i, seed=i) for i, ids in enumerate(prompts(6))]
    alone, batched = alone_and_batched(engine, requests, 4)
    assert [figures(g) for g in alone] == [figures(batched[i]) for i in range(len(requests))]


@pytest.mark.parametrize("token_lag", [0, 4])
def test_stops_forcing_sampling_and_min_tokens_hold_per_sequence(tiny_models, token_lag):
    model = tiny_models["tiny_qwen2"]
    ids = prompts(4)
    first = Engine(model, named_method("full")).generate(Request(ids[0], 8))
    forced = torch.randint(0, 1000, (9,), generator=torch.Generator().manual_seed(7)).tolist()
    requests = [
        Request(ids[0], 30, stop_token_ids={first.tokens[3]}),
        Request(ids[1], 30, forced=forced),
        Request(ids[2], 10, seed=5, sampling=Sampling(temperature=0.8, top_k=20)),
        Request(ids[3], 12, stop_token_ids={first.tokens[0]}, min_new_tokens=12),
        Request(ids[0], 16, stop=lambda tokens: len(tokens) == 5),
    ]
    # With a lag, the greedy rows read their tokens late in the batch as alone, and run past their stops alike.
    engine = Engine(model, named_method("inertia", "rho=0.5"), token_lag=token_lag)
    alone, batched = alone_and_batched(engine, requests, 3)
    for index, generation in enumerate(alone):
        assert figures(generation) == figures(batched[index]), index
    assert len(alone[0].tokens) <= 4 and alone[0].tokens[-1] == first.tokens[3]
    assert alone[1].tokens == forced and len(alone[1].target_logprobs) == len(forced)
    assert len(alone[3].tokens) == 12 and len(alone[4].tokens) == 5


def test_batch_larger_than_the_requests_and_one_token_requests(tiny_models):
    engine = Engine(tiny_models["tiny_llama"], named_method("h2o", "rho=0.5"))
    requests = [Request(ids, 1 + i % 2) for i, ids in enumerate(prompts(3))]
    alone, batched = alone_and_batched(engine, requests, 8)
    assert [figures(g) for g in alone] == [figures(batched[i]) for i in range(3)]
    assert [len(g.tokens) for g in alone] == [1, 2, 1]


def test_decode_time_is_the_batch_steps_a_sequence_took_part_in(tiny_models):
    engine = Engine(tiny_models["tiny_llama"], named_method("inertia", "rho=0.5"))
    done = dict(engine.generate_batch(enumerate([Request(prompts(1)[0], 4), Request(prompts(2)[1], 40)]), 2))
    short, long = done[0], done[1]
    assert [len(short.tokens), len(long.tokens)] == [4, 40]
    assert 0 < short.decode_s < long.decode_s


def run_config(tmp_path: Path, *extra: str):
    return compose_config(
        "model=tiny_llama", "method=inertia", "rho=0.5", "task=ruler", "task.lengths=[512]", "task.n=5",
        "task.tasks=[niah_single_1,niah_single_2]", f"results_dir={tmp_path}", "threads=1", *extra,
    )  # fmt: skip


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def test_a_batched_run_is_a_run_of_its_own_with_batch_ones_outputs_here(tmp_path):
    summary = execute(run_config(tmp_path))
    alone = tmp_path / summary["run_id"]
    expected = {record["example_id"]: record for record in records(alone)}
    assert len(expected) == 10

    # Not bit-exact with batch 1 in general (a near-tie can flip), so never resumed into its folder.
    batched = execute(run_config(tmp_path, "batch_size=4"))
    together = tmp_path / batched["run_id"]
    assert together != alone and batched["n"] == 10 and batched["batch_sizes"] == [4]
    assert prepare(run_config(tmp_path, "batch_size=4")).folder == together
    got = records(together)
    assert {r["identity"]["model"]["batch_size"] for r in got} == {4}

    def comparable(record: dict) -> dict:
        meta = {k: v for k, v in record["meta"].items() if k not in {"batch_size", "decode_tokens_per_s"}}
        model = {k: v for k, v in record["identity"]["model"].items() if k != "batch_size"}
        skip = TIMINGS | {"meta", "decode_tokens_per_s", "run_id", "identity"}
        kept = {k: v for k, v in record.items() if k not in skip}
        return kept | {"meta": meta, "identity": {**record["identity"], "model": model}}

    # On this tiny model no tie is close enough to flip: everything but the timings is batch 1's.
    for record in got:
        assert comparable(record) == comparable(expected[record["example_id"]]), record["example_id"]
    assert execute(run_config(tmp_path, "batch_size=4"))["n"] == 10
    assert len(records(together)) == 10 and len(records(alone)) == 10


def test_batch_size_mistakes_are_one_line(tmp_path):
    for value in ("0", "two", "1.5"):
        refused(lambda value=value: prepare(run_config(tmp_path, f"batch_size={value}")), "batch_size=", UserError)
    refused(lambda: prepare(run_config(tmp_path, "batch_size=2", "diagnostics=true")), "batch_size=2", UserError)
