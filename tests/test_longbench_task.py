"""LongBench task: official prompts, middle truncation before the chat template, loading, ids, config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import pytest
from conftest import assert_one_line
from hydra.utils import instantiate

from harness.config import compose_config, model_spec
from harness.models import load_tokenizer
from tasks.base import Example
from tasks.longbench.protocol import DATASETS, DATASETS_E, MAX_NEW_TOKENS, NO_CHAT_TEMPLATE
from tasks.longbench.task import LongBenchTask, build_prompt

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
FIXTURE_DATASETS = ["narrativeqa", "trec", "samsum", "passage_count", "lcc", "qasper_e", "passage_retrieval_en"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(model_spec("smollm2_135m"))


@pytest.fixture(scope="module")
def task() -> LongBenchTask:
    return LongBenchTask(datasets=FIXTURE_DATASETS, data_dir=str(FIXTURES))


@pytest.fixture(scope="module")
def examples(task: LongBenchTask, tokenizer) -> dict[str, Example]:
    return {example.example_id: example for example in task.examples(tokenizer)}


def record(context: str, question: str) -> dict:
    return {"context": context, "input": question}


def test_protocol_tables_cover_every_dataset() -> None:
    assert len(DATASETS) == 21 and len(DATASETS_E) == 13
    assert sorted(NO_CHAT_TEMPLATE) == ["lcc", "lsht", "repobench-p", "samsum", "trec", "triviaqa"]
    assert MAX_NEW_TOKENS["gov_report"] == 512 and MAX_NEW_TOKENS["hotpotqa"] == 32


def test_prompt_narrativeqa() -> None:
    assert build_prompt("narrativeqa", record("CTX", "Q?")) == (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: CTX\n\n"
        "Now, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\nQuestion: Q?\n\nAnswer:"
    )


def test_prompt_trec_samsum_lcc() -> None:
    assert build_prompt("trec", record("CTX", "Q")) == (
        "Please determine the type of the question below. Here are some examples of questions.\n\nCTX\nQ"
    )
    assert build_prompt("samsum_e", record("CTX", "Q")) == (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\nCTX\n\nQ"
    )
    assert build_prompt("lcc", record("def f():\n", "")) == (
        "Please complete the code given below. \ndef f():\nNext line of code:\n"
    )


def test_prompt_passage_count() -> None:
    assert build_prompt("passage_count", record("P1\n\nP2", "")) == (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. "
        "In other words, how many non-repeating paragraphs are there in total?\n\nP1\n\nP2\n\nPlease enter the "
        "final count of unique paragraphs after removing duplicates. The output format should only contain the "
        "number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    )


def test_prompt_braces_in_context_are_literal() -> None:
    assert "x = {input}" in build_prompt("lcc", record("x = {input}", ""))


def test_examples_from_fixture_files(examples: dict[str, Example]) -> None:
    assert sorted(examples) == sorted(
        [
            "narrativeqa/nqa0001",
            "narrativeqa/nqa0002",
            "trec/trec0001",
            "trec/trec0002",
            "samsum/sam0001",
            "passage_count/pc0001",
            "lcc/lcc0001",
            "qasper_e/qe0001",
            "passage_retrieval_en/pr0001",
        ]
    )
    nqa = examples["narrativeqa/nqa0001"]
    assert nqa.subtask == "narrativeqa" and nqa.max_new_tokens == 128
    assert nqa.answers == ["Pepper", "A red dog called Pepper"]
    assert nqa.meta["length"] == "0-4k" and nqa.meta["truncated"] is False
    assert examples["trec/trec0001"].meta["all_classes"][3] == "City"
    assert examples["qasper_e/qe0001"].max_new_tokens == 128


def test_ids_are_deterministic(task: LongBenchTask, tokenizer, examples: dict[str, Example]) -> None:
    again = {example.example_id: example.input_ids for example in task.examples(tokenizer)}
    assert again == {key: example.input_ids for key, example in examples.items()}


def test_chat_template_only_where_official(tokenizer, examples: dict[str, Example]) -> None:
    header = tokenizer.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False).split("X")[0]
    for example_id, example in examples.items():
        text = tokenizer.decode(example.input_ids)
        dataset = example_id.split("/")[0].removesuffix("_e")
        if dataset in NO_CHAT_TEMPLATE:
            assert "<|im_start|>" not in text, example_id
        else:
            assert text.startswith(header), example_id
            assert text.endswith("<|im_start|>assistant\n"), example_id


def test_raw_datasets_tokenise_the_prompt_alone(tokenizer) -> None:
    task = LongBenchTask(datasets=["lcc"], data_dir=str(FIXTURES))
    [row] = task.records("lcc")
    example = task.build(tokenizer, "lcc", row)
    assert example.input_ids == tokenizer(build_prompt("lcc", row))["input_ids"]


def test_middle_truncation_before_the_chat_template(tokenizer) -> None:
    words = " ".join(f"w{i}" for i in range(400))
    row = {
        "context": words,
        "input": "Who?",
        "answers": ["x"],
        "length": 400,
        "dataset": "narrativeqa",
        "language": "en",
        "all_classes": None,
        "_id": "long",
    }
    prompt = build_prompt("narrativeqa", row)
    ids = tokenizer(prompt)["input_ids"]
    assert len(ids) > 200
    expected = tokenizer.decode(ids[:100], skip_special_tokens=True) + tokenizer.decode(
        ids[-100:], skip_special_tokens=True
    )
    example = LongBenchTask(datasets=["narrativeqa"], max_length=200).build(tokenizer, "narrativeqa", row)
    assert example.meta["truncated"] is True
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": expected}], tokenize=False, add_generation_prompt=True
    )
    assert example.input_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(example.input_ids)
    assert "You are given a story" in text and "Question: Who?\n\nAnswer:" in text
    assert "w0 " in text and "w399" in text and " w200 " not in text

    raw = LongBenchTask(datasets=["samsum"], max_length=200).build(tokenizer, "samsum", dict(row, dataset="samsum"))
    kept = build_prompt("samsum", row)
    kept_ids = tokenizer(kept)["input_ids"]
    cut = tokenizer.decode(kept_ids[:100], skip_special_tokens=True) + tokenizer.decode(
        kept_ids[-100:], skip_special_tokens=True
    )
    assert raw.input_ids == tokenizer(cut)["input_ids"]


def test_samsum_stops_at_the_newline_token_but_not_first(
    task: LongBenchTask, examples: dict[str, Example], tokenizer
) -> None:
    newline = tokenizer.encode("\n", add_special_tokens=False)[-1]
    samsum = examples["samsum/sam0001"]
    assert (samsum.stop_token_ids, samsum.min_new_tokens) == ([newline], 1)
    for other in ("trec/trec0001", "narrativeqa/nqa0001"):
        assert (examples[other].stop_token_ids, examples[other].min_new_tokens) == ([], 0)
    assert task.stop_strings(samsum) == []


def test_score_keys(task: LongBenchTask, examples: dict[str, Example]) -> None:
    assert task.score("Pepper", examples["narrativeqa/nqa0001"]) == {"score": 100.0, "qa_f1": 100.0}
    assert task.score("City\nQuestion: x", examples["trec/trec0001"]) == {"score": 100.0, "classification": 100.0}
    assert task.score("", examples["passage_count/pc0001"]) == {"score": 0.0, "count": 0.0}
    assert task.score("Paragraph 2", examples["passage_retrieval_en/pr0001"])["score"] == 100.0
    assert task.score("            found.append(name)", examples["lcc/lcc0001"])["code_sim"] == 100.0


def test_chinese_fixture(tokenizer) -> None:
    task = LongBenchTask(datasets=["multifieldqa_zh"], data_dir=str(FIXTURES))
    [example] = task.examples(tokenizer)
    assert "问题：小明住在哪里？\n回答：" in tokenizer.decode(example.input_ids)
    assert task.score("北京。", example)["qa_f1_zh"] == 100.0


def test_missing_local_file_says_how_to_get_it(tmp_path: Path) -> None:
    task = LongBenchTask(datasets=["narrativeqa"], data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError) as error:
        task.records("narrativeqa")
    message = str(error.value)
    assert "narrativeqa.jsonl" in message and "task.data_dir=" in message and "data.zip" in message


def test_unreachable_hub_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'zai-org/LongBench' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError) as error:
        LongBenchTask(datasets=["trec"]).records("trec")
    message = str(error.value)
    assert "zai-org/LongBench@36914d6211386125c6fc4ce7db4a6a777fadd34c" in message and "data_dir=trec" in message
    assert "task.data_dir=" in message and "trec.jsonl" in message


def test_validation() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'nope' — choose from narrativeqa, .*qasper_e"):
        LongBenchTask(datasets=["nope"])
    with pytest.raises(ValueError, match="twice"):
        LongBenchTask(datasets=["trec", "trec"])
    with pytest.raises(ValueError, match="max_length"):
        LongBenchTask(max_length=1)


def test_identity_leaves_out_selection() -> None:
    one = LongBenchTask(datasets=["trec"], n=1).identity()
    assert one == LongBenchTask(datasets=["trec", "lcc"], n=None).identity()
    assert one != LongBenchTask(datasets=["trec"], max_length=8000).identity()


def test_hydra_config() -> None:
    task = instantiate(compose_config("task=longbench").task)
    assert isinstance(task, LongBenchTask) and task.datasets == list(DATASETS)
    task = instantiate(
        compose_config("task=longbench", "task.datasets=[trec,lcc_e]", "task.n=2", "task.max_length=3500").task
    )
    assert task.datasets == ["trec", "lcc_e"] and task.n == 2 and task.max_length == 3500


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"datasets": []}, "task.datasets=[] is empty — choose from narrativeqa,"),
        ({"datasets": ["trec", "trec"]}, "task.datasets=['trec', 'trec'] lists 'trec' twice — "),
        ({"n": "all"}, "task.n='all' must be null or an integer >= 1 — use e.g. task.n=50"),
        ({"max_length": 1}, "task.max_length=1 must be an integer >= 2 — use e.g. task.max_length=3500"),
        ({"max_length": "4k"}, "task.max_length='4k' must be an integer >= 2 — "),
        ({"revision": 1234}, "task.revision=1234 is not a string — quote it: task.revision='1234'"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        LongBenchTask(**options)
    assert_one_line(str(raised.value))


def test_records_outside_the_hub_schema_are_refused(tmp_path: Path) -> None:
    good = json.loads((FIXTURES / "trec.jsonl").read_text().splitlines()[0])
    (tmp_path / "trec.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, "length": None}) + "\n")
    with pytest.raises(
        ValueError, match=r"trec\.jsonl: record 2 has no value for the hub fields \['length'\] — "
    ) as raised:
        LongBenchTask(datasets=["trec"], data_dir=str(tmp_path)).records("trec")
    assert_one_line(str(raised.value))
    assert "task.data_dir=" in str(raised.value)
