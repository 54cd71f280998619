"""lm-eval both ways: the evictbench lm-eval model against direct engine calls, and ``task=lm_eval`` records.

The tasks are lm-eval YAMLs in tests/fixtures/lm_eval/tasks on a local file, one per request
type; the model is the tiny random llama. References are built by hand: the prompt from the
tokenizer, the answer from ``Engine.generate`` (or a plain forward of a second copy of the model
with its own attention, for the full cache).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import lm_eval
import pytest
import torch
from conftest import assert_one_line, refused
from hydra.utils import instantiate

from harness.config import compose_config, model_spec
from harness.decode.engine import Engine, Request
from harness.errors import UserError
from harness.lm_eval_model import EvictbenchLM, overrides
from harness.models import load_model, load_tokenizer
from harness.protocols.requests import example_seed, stop_on_strings, stop_token_ids
from harness.run import execute
from tasks.base import CallResult
from tasks.lm_eval.requests import LmEvalRequests
from tasks.lm_eval.task import LmEvalTask, task_manager

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests/fixtures/lm_eval/tasks"
ROWS = [json.loads(line) for line in (ROOT / "tests/fixtures/lm_eval/toy.jsonl").read_text().splitlines()]
GPQA = ROOT / "tests/fixtures/gpqa/gpqa_diamond.csv"


@pytest.fixture(autouse=True)
def repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fixture task YAMLs name their data file relative to the repository root, as lm-eval reads it.
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(model_spec("tiny_llama"))


@pytest.fixture(scope="module")
def inertia_lm() -> EvictbenchLM:
    return EvictbenchLM(model="tiny_llama", method="inertia", rho=0.5, threads=1)


def documents(tok: Any, *names: str, **options: Any) -> tuple[LmEvalTask, list]:
    task = LmEvalTask(tasks=list(names), n=None, include_path=str(TASKS), **options)
    return task, task.examples(tok)


def requests_of(task: LmEvalTask) -> list:
    return [request for document in task._documents.values() for request in document.requests]


def encode(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def split_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's context/continuation split: the continuation is what the joint encoding adds to the context's."""
    whole, head = encode(tok, context + continuation), encode(tok, context)
    return head, whole[len(head) :]


def engine_for(*config: str) -> tuple[Engine, Any]:
    cfg = compose_config("model=tiny_llama", *config)
    model = load_model(model_spec("tiny_llama"))
    return Engine(model, instantiate(cfg.method)), model


def plain_logprobs(ids: list[int], continuation: list[int]) -> list[float]:
    """Log-probabilities of ``continuation`` after ``ids`` from one plain forward of a fresh copy of the model."""
    model = load_model(model_spec("tiny_llama"))
    with torch.inference_mode():
        logits = model(torch.tensor([ids + continuation])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(ids) - 1 + i, token]) for i, token in enumerate(continuation)]


def test_requests_are_lm_evals_own_prompts(tok: Any) -> None:
    task, examples = documents(tok, "toy_gen", "toy_choice", "toy_cloze", "toy_rolling")
    assert [example.example_id for example in examples] == [
        f"{name}/{doc:05d}" for name in ("toy_gen", "toy_choice", "toy_cloze", "toy_rolling") for doc in range(3)
    ]
    prompt = ROWS[0]["question"] + "\nAnswer:"
    (generation,) = examples[0].calls
    assert generation.input_ids == encode(tok, prompt) and generation.max_new_tokens == 6
    assert generation.stop_strings == ["\n", ".", tok.eos_token] and generation.forced_ids is None
    options = examples[3].calls
    assert [call.forced_ids for call in options] == [split_pair(tok, prompt, f" {c}")[1] for c in ROWS[0]["choices"]]
    assert all(call.ranked and call.input_ids == encode(tok, prompt) for call in options)
    (cloze,) = examples[6].calls
    assert not cloze.ranked and (cloze.input_ids, cloze.forced_ids) == split_pair(tok, prompt, " Morrow")
    (window,) = examples[9].calls
    assert window.input_ids == [tok.bos_token_id] and window.forced_ids == encode(tok, ROWS[0]["question"])


def test_generate_until_matches_the_engine(tok: Any, inertia_lm: EvictbenchLM) -> None:
    task, examples = documents(tok, "toy_gen")
    answers = inertia_lm.generate_until(requests_of(task), disable_tqdm=True)
    engine, model = engine_for("method=inertia", "rho=0.5")
    until = ["\n", ".", tok.eos_token]
    for doc, (row, answer) in enumerate(zip(ROWS, answers, strict=True)):
        generation = engine.generate(
            Request(
                encode(tok, row["question"] + "\nAnswer:"),
                6,
                stop_token_ids=stop_token_ids(model, tok),
                stop=stop_on_strings(tok, until),
                seed=example_seed(0, f"toy_gen/{doc:05d}/0/0"),
            )
        )
        assert generation.budget == len(examples[doc].input_ids) // 2
        text = tok.decode(generation.tokens, skip_special_tokens=True)
        for stop in until:
            text = text.split(stop)[0]
        assert answer == text


def test_loglikelihood_under_eviction_matches_the_engine(tok: Any, inertia_lm: EvictbenchLM) -> None:
    task, _ = documents(tok, "toy_cloze")
    answers = inertia_lm.loglikelihood(requests_of(task), disable_tqdm=True)
    engine, _ = engine_for("method=inertia", "rho=0.5")
    for row, (logprob, greedy) in zip(ROWS, answers, strict=True):
        context, continuation = split_pair(tok, row["question"] + "\nAnswer:", " " + row["answer"])
        generation = engine.generate(Request(context, len(continuation), forced=continuation))
        assert generation.budget == len(context) // 2
        assert logprob == pytest.approx(sum(generation.target_logprobs), abs=1e-6)
        assert greedy == all(generation.target_greedy)


def test_full_cache_scores_are_the_models_own(tok: Any) -> None:
    """Multiple choice and rolling windows with the full cache equal a plain forward's log-probabilities."""
    task, _ = documents(tok, "toy_choice", "toy_rolling")
    lm = EvictbenchLM(model="tiny_llama", method="full", threads=1)
    requests = requests_of(task)
    choices = lm.loglikelihood([r for r in requests if r.request_type == "loglikelihood"], disable_tqdm=True)
    rolling = lm.loglikelihood_rolling([r for r in requests if r.request_type != "loglikelihood"], disable_tqdm=True)
    expected = [
        sum(plain_logprobs(*split_pair(tok, row["question"] + "\nAnswer:", f" {choice}")))
        for row in ROWS
        for choice in row["choices"]
    ]
    assert [logprob for logprob, _ in choices] == pytest.approx(expected, abs=1e-4)
    texts = [sum(plain_logprobs([tok.bos_token_id], encode(tok, row["question"]))) for row in ROWS]
    assert rolling == pytest.approx(texts, abs=1e-4)


def test_harness_records_agree_with_lm_evals_own_run(tmp_path: Path) -> None:
    """Both ways serve the same calls: ``task=lm_eval`` records hold what ``lm_eval.simple_evaluate`` logs."""
    options = ["model=tiny_llama", "method=inertia", "rho=0.5", "threads=1", f"results_dir={tmp_path}"]
    tasks = ["task=lm_eval", "task.tasks=[toy_gen,toy_cloze]", f"task.include_path={TASKS}", "task.n=2"]
    summary = execute(compose_config(*options, *tasks))
    records = [json.loads(line) for line in (tmp_path / summary["run_id"] / "records.jsonl").read_text().splitlines()]
    ids = [f"{name}/{doc:05d}" for name in ("toy_gen", "toy_cloze") for doc in range(2)]
    assert [record["example_id"] for record in records] == ids
    logged = lm_eval.simple_evaluate(
        model="evictbench",
        model_args="model=tiny_llama,method=inertia,rho=0.5,threads=1",
        tasks=["toy_gen", "toy_cloze"],
        task_manager=task_manager(str(TASKS)),
        limit=2,
        bootstrap_iters=0,
    )["samples"]
    for record, sample in zip(records[:2], logged["toy_gen"], strict=True):
        assert record["prediction"] == sample["filtered_resps"][0] and record["answers"] == [sample["target"]]
        assert record["metrics"] == {"exact_match,none": sample["exact_match"]}
    for record, sample in zip(records[2:], logged["toy_cloze"], strict=True):
        logprob, greedy = sample["resps"][0][0]
        assert record["metrics"] == pytest.approx({"perplexity,none": math.exp(-logprob), "acc,none": float(greedy)})
        assert record["budget"] == record["prefill_len"] // 2 and record["meta"]["calls"] == 1
    assert execute(compose_config(*options, *tasks))["n"] == 4


def test_multiple_choice_under_eviction_is_refused(tmp_path: Path) -> None:
    options = ["model=tiny_llama", "method=inertia", "rho=0.9", f"results_dir={tmp_path}", "task=lm_eval"]
    cfg = compose_config(*options, "task.tasks=[toy_choice]", f"task.include_path={TASKS}", "task.n=1")
    message = refused(lambda: execute(cfg), "multiple-choice", UserError)
    assert "rho=0" in message and not list(tmp_path.iterdir())
    lm = EvictbenchLM(model="tiny_llama", method="inertia", rho=0.9, threads=1)
    task, _ = documents(lm.tokenizer, "toy_choice")
    refused(lambda: lm.loglikelihood(requests_of(task), disable_tqdm=True), "multiple-choice", UserError)


def test_sampling_arguments_become_the_calls_sampling(tok: Any) -> None:
    task, _ = documents(tok, "toy_gen", gen_kwargs={"do_sample": True, "temperature": 0.7, "top_p": 0.9})
    (request, *_) = requests_of(task)
    adapter = LmEvalRequests(tok)
    first, second = adapter.calls(request, 0)[0], adapter.calls(request, 1)[0]
    assert first.sampling == {"temperature": 0.7, "top_k": 0, "top_p": 0.9}
    assert (first.seed_key, second.seed_key) == ("toy_gen/00000/0/0", "toy_gen/00000/0/1")
    refused(lambda: documents(tok, "toy_gen", gen_kwargs={"num_beams": 4}), "num_beams")
    refused(lambda: documents(tok, "toy_gen", gen_kwargs={"do_sample": True, "temperature": 0}), "temperature")


def test_user_mistakes_are_one_line(tok: Any) -> None:
    refused(lambda: LmEvalTask(tasks=["toy_gen_typo"], include_path=str(TASKS)).examples(tok), "toy_gen_typo")
    refused(lambda: LmEvalTask(tasks=[]), "task.tasks")
    refused(lambda: LmEvalTask(tasks=["toy_gen"], revisions={"other": "abc"}), "task.revisions")
    refused(lambda: LmEvalTask(include_path="/no/such/folder"), "task.include_path", FileNotFoundError)
    refused(lambda: overrides({"budget": 8}), "--model_args budget=8")
    refused(lambda: EvictbenchLM(batch_size="four", model="tiny_llama"), "--batch_size 'four'", UserError)
    refused(lambda: EvictbenchLM(batch_size=0, model="tiny_llama"), "--batch_size 0", UserError)
    assert overrides({"model": "tiny_llama", "rho": 0.5, "method.selection.budget_tokens": 8}, "cpu") == [
        "model=tiny_llama",
        "rho=0.5",
        "method.selection.budget_tokens=8",
        "model.device=cpu",
    ]


def gpqa_letters() -> list[str]:
    """The correct option letter per fixture row: lm-eval shuffles the options with Python's random at seed 0."""
    import csv

    random.seed(0)
    letters = []
    for row in csv.DictReader(GPQA.open()):
        options = [row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)] + [row["Correct Answer"].strip()]
        random.shuffle(options)
        letters.append("ABCD"[options.index(row["Correct Answer"].strip())])
    return letters


def test_gpqa_diamond_from_the_hub_schema_fixture(tok: Any) -> None:
    cfg = compose_config("model=tiny_llama", "task=gpqa_diamond", f"task.data_files.gpqa_diamond_cot_zeroshot={GPQA}")
    task = instantiate(cfg.task)
    examples = task.examples(tok)
    letters = gpqa_letters()
    assert [example.answers for example in examples] == [[f"({letter})"] for letter in letters]
    assert [example.example_id for example in examples] == [f"gpqa_diamond_cot_zeroshot/{i:05d}" for i in range(3)]
    prompt = tok.decode(examples[0].calls[0].input_ids)
    assert prompt.startswith("What is the correct answer to this question:") and "(D) " in prompt
    assert prompt.endswith("Let's think step by step: ")
    right, wrong = letters[0], "ABCD"[("ABCD".index(letters[0]) + 1) % 4]
    scored = task.score_calls([CallResult(f"So the answer is ({wrong}). The answer is ({right}).")], examples[0])
    assert scored.metrics == {"exact_match,strict-match": 1.0, "exact_match,flexible-extract": 1.0}
    scored = task.score_calls([CallResult(f"Maybe ({right})... no: ({wrong})")], examples[0])
    assert scored.metrics == {"exact_match,strict-match": 0.0, "exact_match,flexible-extract": 0.0}


def test_gpqa_diamond_off_the_hub_is_one_line_naming_the_commit_and_the_local_file(tok: Any, offline_hub: None) -> None:
    pinned = instantiate(compose_config("model=tiny_llama", "task=gpqa_diamond").task)
    message = refused(lambda: pinned.examples(tok), "could not load Idavidrein/gpqa@90b8e5be2b1d", FileNotFoundError)
    assert_one_line(message)
    assert "only the datasets cache was read" in message
    assert "task.data_files.gpqa_diamond_cot_zeroshot=<file in the hub schema>" in message
    unpinned = compose_config("model=tiny_llama", "task=gpqa_diamond", "task.revisions.gpqa_diamond_cot_zeroshot=null")
    assert_one_line(refused(lambda: instantiate(unpinned.task).examples(tok), "task.revisions.gpqa_diamond"))


@pytest.mark.parametrize(
    ("name", "kind", "rho"),
    [("toy_gen", "generate_until", 0.5), ("toy_cloze", "loglikelihood", 0.5), ("toy_choice", "loglikelihood", 0)],
)
def test_batched_requests_answer_as_one_at_a_time(tok: Any, name: str, kind: str, rho: float) -> None:
    task, _ = documents(tok, name)
    answers = [
        getattr(EvictbenchLM(model="tiny_llama", method="inertia", rho=rho, threads=1, batch_size=size), kind)(
            requests_of(task), True
        )
        for size in (1, 3)
    ]
    assert answers[0] == answers[1] and len(answers[0]) == len(requests_of(task))
