"""Perplexity under eviction: windows, sources, and teacher forcing through the real engine."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import hydra.utils
import pytest
import torch
from conftest import assert_one_line

from harness.config import compose_config, model_spec
from harness.decode import kv_cache
from harness.decode.engine import Engine, Request
from harness.models import load_tokenizer
from methods.full import FullCache
from tasks.perplexity.task import PerplexityTask
from tests.conftest import named_method

FIXTURE = Path(__file__).resolve().parent / "fixtures/ppl/wikitext_test.jsonl"


@pytest.fixture(scope="module")
def tok() -> Any:
    spec = model_spec("smollm2_135m")
    return load_tokenizer(spec)


def test_windows_are_consecutive(tok: Any) -> None:
    examples = PerplexityTask(prefill=64, eval_tokens=16, n=3).examples(tok)
    text = (Path(__file__).resolve().parents[1] / "tasks/corpora/asv_genesis_numbers.txt").read_text()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert [ex.example_id for ex in examples] == [f"ppl/64/16/{i:04d}" for i in range(3)]
    joined = []
    for ex in examples:
        assert len(ex.input_ids) == 64 and len(ex.forced_ids) == ex.max_new_tokens == 16
        joined += ex.input_ids + ex.forced_ids
        assert ex.meta["length"] == 64
    assert joined == ids[: 3 * 80]


def test_hub_schema_fixture_and_text_file(tok: Any, tmp_path: Path) -> None:
    hub = {"path": "wikitext", "name": "wikitext-103-raw-v1", "split": "test", "data_files": str(FIXTURE)}
    task = PerplexityTask(prefill=24, eval_tokens=8, n=2, hub=hub)
    rows = [json.loads(line)["text"] for line in FIXTURE.read_text().splitlines()]
    ids = tok("\n\n".join(rows), add_special_tokens=False)["input_ids"]
    examples = task.examples(tok)
    assert examples[1].input_ids + examples[1].forced_ids == ids[32:64]
    assert task.identity()["source"]["name"] == "wikitext-103-raw-v1"
    path = tmp_path / "text.txt"
    path.write_text("one two three four five six seven eight nine ten " * 20)
    assert PerplexityTask(prefill=16, eval_tokens=4, n=2, text_file=str(path)).examples(tok)[0].forced_ids
    with pytest.raises(ValueError, match="fewer than task.n=50 windows"):
        PerplexityTask(prefill=16, eval_tokens=4, n=50, text_file=str(path)).examples(tok)


def test_missing_hub_data_says_how_to_get_it(offline_hub: None) -> None:
    task = PerplexityTask(hub={"path": "wikitext", "name": "wikitext-103-raw-v1", "split": "test"})
    with pytest.raises(
        FileNotFoundError,
        match=r"wikitext@None \(wikitext-103-raw-v1\).* — .*task\.hub\.data_files=path/to/file\.jsonl",
    ):
        task.examples(None)
    with pytest.raises(
        ValueError, match=r"task\.hub=.*\['dataset'\] — .*path, name, split, revision, column, data_files"
    ):
        PerplexityTask(hub={"dataset": "wikitext"})
    with pytest.raises(ValueError, match="not both"):
        PerplexityTask(hub={"path": "wikitext"}, text_file="x.txt")


def test_score_logprobs() -> None:
    task = PerplexityTask()
    fake = type("E", (), {"forced_ids": [1, 2, 3], "example_id": "x"})()
    metrics = task.score_logprobs([math.log(0.5), math.log(0.25), math.log(0.125)], fake)
    assert list(metrics) == ["ppl", "nll", "tokens"]
    assert metrics["nll"] == pytest.approx(2 * math.log(2)) and metrics["ppl"] == pytest.approx(4.0)
    assert metrics["tokens"] == 3.0
    with pytest.raises(ValueError, match="2 log-probabilities for 3"):
        task.score_logprobs([0.0, 0.0], fake)


def test_full_cache_matches_one_plain_forward(tiny_models: dict, tok: Any) -> None:
    model = tiny_models["tiny_llama"]
    task = PerplexityTask(prefill=48, eval_tokens=12, n=1)
    [example] = task.examples(tok)
    generation = Engine(model, FullCache()).generate(Request(example.input_ids, 1, forced=example.forced_ids))
    metrics = task.score_logprobs(generation.target_logprobs, example)
    ids = torch.tensor([example.input_ids + example.forced_ids])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(example.input_ids) - 1 : -1].float()
    nll = -torch.log_softmax(logits, -1).gather(1, torch.tensor(example.forced_ids)[:, None]).mean().item()
    assert metrics["nll"] == pytest.approx(nll, rel=1e-4)
    assert metrics["ppl"] == pytest.approx(math.exp(nll), rel=1e-4)


def test_budget_holds_at_every_forced_token(tiny_models: dict, tok: Any) -> None:
    [example] = PerplexityTask(prefill=48, eval_tokens=12, n=1).examples(tok)
    engine = Engine(tiny_models["tiny_llama"], named_method("streaming_llm", "rho=0.5", "method.selection.window=8"))
    lengths: list[list[int]] = []
    engine.on_step = lambda step, context, cache: lengths.append(kv_cache.cache_lengths(cache))
    generation = engine.generate(Request(example.input_ids, 1, forced=example.forced_ids))
    assert generation.budget == 24 and len(generation.target_logprobs) == 12
    # A decode-time method keeps the prefill whole (the first target is scored from it), then
    # every forced token enters the cache and the cache is back at B before the next one.
    assert len(lengths) == 12 and set(lengths[0]) == {48}
    assert all(set(step) == {24} for step in lengths[1:])


def test_config_instantiates() -> None:
    task = hydra.utils.instantiate(compose_config("task=ppl").task)
    assert isinstance(task, PerplexityTask)
    assert (task.prefill, task.eval_tokens, task.n, task.text_file, task.hub) == (1024, 256, 4, None, None)
    hub = "task.hub={path: wikitext, name: wikitext-103-raw-v1, split: test}"
    task = hydra.utils.instantiate(compose_config("task=ppl", hub).task)
    assert task.hub == {"path": "wikitext", "name": "wikitext-103-raw-v1", "split": "test"}
    assert task.identity()["source"]["path"] == "wikitext"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"prefill": "abc"}, "task.prefill='abc' must be an integer >= 1 — use e.g. task.prefill=1024"),
        ({"eval_tokens": 0}, "task.eval_tokens=0 must be an integer >= 1 — "),
        ({"n": 1.5}, "task.n=1.5 must be an integer >= 1 — "),
        (
            {"hub": "wikitext"},
            "task.hub='wikitext' is not a mapping of path, name, split, revision, column, data_files — ",
        ),
        ({"hub": {"name": "wikitext-103-raw-v1"}}, "task.hub.path=None is not a dataset id — "),
        ({"hub": {"path": "wikitext", "revision": 1234}}, "task.hub.revision=1234 is not a string — quote it"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        PerplexityTask(**options)
    assert_one_line(str(raised.value))


def test_hub_rows_that_are_not_text_are_refused(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "one"}\n{"text": null}\n')
    task = PerplexityTask(hub={"path": "wikitext", "data_files": str(rows)})
    with pytest.raises(
        ValueError, match=re.escape("wikitext: row 2 of column 'text' holds None, not text — ")
    ) as raised:
        task.examples(None)
    assert_one_line(str(raised.value))
    assert "task.hub.data_files" in str(raised.value)
