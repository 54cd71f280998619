"""LongBench-v2 task: official templates, answer regex, truncation, loading, breakdown fields, config."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from conftest import refused
from hydra.utils import instantiate

from harness.config import compose_config, model_spec
from harness.decode.engine import Engine, Request
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.protocols.requests import stop_token_ids
from harness.run import execute
from methods.full import FullCache
from tasks.base import TaskProtocol
from tasks.longbench_v2.protocol import TEMPLATE_0SHOT, extract_answer, fill
from tasks.longbench_v2.task import LongBenchV2Task

FIXTURES = Path(__file__).parent / "fixtures" / "longbench_v2"
RECORD = {
    "context": "  Some document.\n",
    "question": " Which one? ",
    "choice_A": "alpha",
    "choice_B": "beta ",
    "choice_C": "gamma",
    "choice_D": "delta",
}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(model_spec("smollm2_135m"))


def test_zero_shot_prompt() -> None:
    assert fill(TEMPLATE_0SHOT, RECORD) == (
        "Please read the following text and answer the question below.\n\n<text>\nSome document.\n</text>\n\n"
        "What is the correct answer to this question: Which one?\nChoices:\n(A) alpha\n(B) beta\n(C) gamma\n"
        '(D) delta\n\nFormat your response as follows: "The correct answer is (insert answer here)".'
    )


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The correct answer is (B)", "B"),
        ("The correct answer is B.", "B"),
        ("**The correct answer is (C)**", "C"),
        ("The correct answer is **D**", "D"),
        ("The correct answer is A, no wait. The correct answer is (C)", "C"),
        ("The correct answer is (E)", None),
        ("the correct answer is (B)", None),
        ("B", None),
        ("", None),
    ],
)
def test_extract_answer(response: str, letter: str | None) -> None:
    assert extract_answer(response) == letter


def test_examples_and_scores(tokenizer) -> None:
    task = LongBenchV2Task(data_dir=str(FIXTURES))
    examples = task.examples(tokenizer)
    assert [e.example_id for e in examples] == [
        "longbench_v2/66f000000000000000000001",
        "longbench_v2/66f000000000000000000002",
        "longbench_v2/66f000000000000000000003",
    ]
    assert [e.example_id for e in task.examples(tokenizer)] == [e.example_id for e in examples]
    first, second, third = examples
    assert {e.subtask for e in examples} == {"longbench_v2"}
    assert (second.meta["difficulty"], second.meta["length"]) == ("hard", "medium")
    assert first.answers == ["B"] and first.max_new_tokens == 128
    text = tokenizer.decode(third.input_ids)
    assert "What is the correct answer to this question: In which chapter is the mill sold?\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert task.score(" The correct answer is (B).", first) == {"acc": 1.0}
    assert task.score("The correct answer is (A)", first) == {"acc": 0.0}
    assert task.score("", first) == {"acc": 0.0}
    assert task.score("I think it is B", first) == {"acc": 0.0}
    assert task.stop_strings(first) == []


def test_cot(tokenizer) -> None:
    example = LongBenchV2Task(data_dir=str(FIXTURES), cot=True, n=1).examples(tokenizer)[0]
    assert example.max_new_tokens == 1024
    assert "(D) Nobody\n\nLet\u2019s think step by step:<|im_end|>" in tokenizer.decode(example.input_ids)


def test_cot_answer_pass(tokenizer) -> None:
    task = LongBenchV2Task(data_dir=str(FIXTURES), cot=True, n=1)
    [example] = task.examples(tokenizer)
    answer = task.follow_up(tokenizer, example, "  The mill passes to the nephew.\n")
    assert answer.example_id == f"{example.example_id}/answer" and answer.answers == example.answers == ["B"]
    assert answer.max_new_tokens == 128
    user = tokenizer.decode(answer.input_ids).split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert user == (
        "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here."
        "\n\nWhat is the correct answer to this question: Who buys the mill?\nChoices:\n(A) The glacier guide\n"
        "(B) Ilse's nephew\n(C) The mayor\n(D) Nobody\n\nLet\u2019s think step by step: The mill passes to the "
        "nephew.\n\nBased on the above, what is the single, most likely answer choice? Format your response as "
        'follows: "The correct answer is (insert answer here)".'
    )
    # No reasoning, no answer pass (pred.py drops the question; here it scores 0); 0-shot has none.
    assert task.follow_up(tokenizer, example, " \n") is None
    assert task.protocol is TaskProtocol.GENERATE_THEN_ANSWER
    assert LongBenchV2Task(data_dir=str(FIXTURES), n=1).protocol is TaskProtocol.GENERATE


def test_cot_runs_both_passes_through_the_harness(tmp_path: Path, tokenizer) -> None:
    overrides = ("model=tiny_llama", "task=longbench_v2", f"task.data_dir={FIXTURES}", "task.cot=true", "task.n=1")
    cfg = compose_config(*overrides, "method=inertia", "rho=0.5", "threads=1", f"results_dir={tmp_path}")
    summary = execute(cfg)
    [record] = [json.loads(line) for line in (tmp_path / summary["run_id"] / "records.jsonl").read_text().splitlines()]
    task = instantiate(cfg.task)
    [example] = task.examples(tokenizer)
    reasoning = record["meta"]["first_prediction"]
    assert record["prefill_len"] == len(example.input_ids) and record["budget"] == len(example.input_ids) // 2
    answer = task.follow_up(tokenizer, example, reasoning)
    assert answer is not None and record["meta"]["answer_pass"]["prefill_len"] == len(answer.input_ids)
    # The answer pass is the full-cache generation from the reasoning, and it is what gets scored.
    model = load_model(ModelSpec.from_config(cfg.model))
    full = Engine(model, FullCache()).generate(
        Request(answer.input_ids, 128, stop_token_ids=stop_token_ids(model, tokenizer))
    )
    assert record["prediction"] == tokenizer.decode(full.tokens, skip_special_tokens=True)
    assert record["meta"]["answer_pass"]["new_tokens"] == full.new_tokens
    assert record["metrics"] == {"acc": float(extract_answer(record["prediction"].strip()) == "B")}


def test_truncation_keeps_the_larger_half_at_the_end(tokenizer) -> None:
    task = LongBenchV2Task(data_dir=str(FIXTURES), max_length=41, n=1)
    [row] = task.records()
    ids = tokenizer(fill(TEMPLATE_0SHOT, row))["input_ids"]
    kept = tokenizer.decode(ids[:20], skip_special_tokens=True) + tokenizer.decode(ids[-21:], skip_special_tokens=True)
    example = task.build(tokenizer, row)
    assert example.meta["truncated"] is True
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": kept}], tokenize=False, add_generation_prompt=True
    )
    assert example.input_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_missing_data_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"task\.data_dir=<the folder holding data\.json>"):
        LongBenchV2Task(data_dir=str(tmp_path)).records()

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'zai-org/LongBench-v2' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match=r"zai-org/LongBench-v2@2b48e494.* — .*task\.data_dir="):
        LongBenchV2Task().records()


def test_hydra_config() -> None:
    task = instantiate(compose_config("task=longbench_v2", "task.cot=true", "task.n=5").task)
    assert isinstance(task, LongBenchV2Task) and task.cot is True and task.n == 5
    assert task.identity() != LongBenchV2Task().identity()
    assert LongBenchV2Task(n=3).identity() == LongBenchV2Task().identity()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"n": 0}, "task.n=0 must be null or an integer >= 1 — "),
        ({"max_length": "long"}, "task.max_length='long' must be an integer >= 2 — use e.g. task.max_length=120000"),
        ({"data_dir": 5}, "task.data_dir=5 is not a string — quote it"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: LongBenchV2Task(**options), named)


def test_records_outside_the_hub_schema_are_refused(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text(json.dumps([{"_id": "a", "question": "q?"}]))
    with pytest.raises(ValueError, match=r"data\.json: record 1 lacks the hub fields \['domain', .* — ") as raised:
        LongBenchV2Task(data_dir=str(tmp_path)).records()
    assert "\n" not in str(raised.value) and "task.data_dir=" in str(raised.value)
