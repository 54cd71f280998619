"""AIME/HMMT task: hub-schema loading, prompts, k samples per problem, pass@1, scoring, config."""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path

import datasets
import pytest
from conftest import refused

from harness.config import model_spec
from harness.models import load_tokenizer
from harness.record.summary import summarize
from tasks.math.sources import SOURCES
from tasks.math.task import INSTRUCTION, MathTask, build_prompt, pass_at_1

FIXTURES = Path(__file__).parent / "fixtures" / "math"
THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(model_spec("smollm2_135m"))


def task(*competitions: str, **options) -> MathTask:
    return MathTask(competitions=list(competitions), data_file=str(FIXTURES), **options)


@pytest.mark.parametrize("competition", sorted(SOURCES))
def test_fixture_loads_in_hub_schema(competition: str) -> None:
    problems = task(competition).problems(competition)
    assert len(problems) == 2
    rows = [json.loads(line) for line in (FIXTURES / f"{competition}.jsonl").read_text().splitlines()]
    source = SOURCES[competition]
    assert [source.problem(row) for row in rows] == problems
    assert problems[0].problem_id == str(rows[0][source.id_field]) and isinstance(rows[0][source.id_field], int)
    single = MathTask(competitions=[competition], data_file=str(FIXTURES / f"{competition}.jsonl"))
    assert single.problems(competition) == problems


def test_sources_record_the_hub_schemas() -> None:
    assert SOURCES["aime_2024"].hub_id == "HuggingFaceH4/aime_2024"
    assert SOURCES["aime_2024"].schema() == ("id", "problem", "answer")
    for name in ("aime_2025", "hmmt_feb_2025", "hmmt_nov_2025"):
        assert SOURCES[name].hub_id == f"MathArena/{name}"
        assert SOURCES[name].schema() == ("problem_idx", "problem", "answer")
        assert SOURCES[name].split == "train"


def test_k_samples_per_problem_with_stable_ids(tokenizer) -> None:
    examples = task("aime_2024", "aime_2025", samples=3, max_new_tokens=77).examples(tokenizer)
    assert [e.example_id for e in examples[:4]] == [
        "aime_2024/60/s0",
        "aime_2024/60/s1",
        "aime_2024/60/s2",
        "aime_2024/61/s0",
    ]
    assert len(examples) == 2 * 2 * 3 and len({e.example_id for e in examples}) == 12
    assert {e.subtask for e in examples} == {"aime_2024", "aime_2025"}
    first = examples[:3]
    assert all(e.input_ids == first[0].input_ids and e.answers == ["5"] for e in first)
    assert [e.meta["sample"] for e in first] == [0, 1, 2] and {e.meta["problem_id"] for e in first} == {"60"}
    assert all(e.max_new_tokens == 77 for e in examples)
    assert len(task("hmmt_feb_2025", samples=1, n=1).examples(tokenizer)) == 1


def test_prompt_is_problem_then_instruction_in_chat_template(tokenizer) -> None:
    example = task("hmmt_feb_2025", samples=1).examples(tokenizer)[0]
    text = tokenizer.decode(example.input_ids)
    assert build_prompt("P?") == "P?\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert "<|im_start|>user\nCompute $\\frac{1}{3}+\\frac{1}{6}$.\n" + INSTRUCTION + "<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_thinking_switch_reaches_templates_that_take_it(tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    plain = task("aime_2025", samples=1).examples(tokenizer)[0].input_ids
    with caplog.at_level(logging.WARNING):
        ignored = task("aime_2025", samples=1, thinking=False).examples(tokenizer)[0].input_ids
    assert ignored == plain and "enable_thinking" in caplog.text
    qwen3_like = copy.deepcopy(tokenizer)
    qwen3_like.chat_template = THINKING_TEMPLATE
    on = tokenizer_text(qwen3_like, task("aime_2025", samples=1, thinking=True))
    off = tokenizer_text(qwen3_like, task("aime_2025", samples=1, thinking=False))
    assert "<think>" not in on and off.endswith("<|assistant|><think>\n\n</think>\n\n")


def tokenizer_text(tokenizer, math_task: MathTask) -> str:
    return tokenizer.decode(math_task.examples(tokenizer)[0].input_ids)


def test_score_uses_the_answer_after_thinking(tokenizer) -> None:
    hmmt = task("hmmt_feb_2025", samples=1)
    half, twice_height = hmmt.examples(tokenizer)
    assert hmmt.score(r"... so $\boxed{\dfrac{2}{4}}$", half) == {"correct": 1.0, "boxed": 1.0}
    assert hmmt.score(r"\boxed{\sqrt{12}}", twice_height) == {"correct": 1.0, "boxed": 1.0}
    assert hmmt.score(r"\boxed{3\sqrt{2}}", twice_height) == {"correct": 0.0, "boxed": 1.0}
    assert hmmt.score("the answer is 0.5", half) == {"correct": 1.0, "boxed": 0.0}
    assert hmmt.score("", half) == {"correct": 0.0, "boxed": 0.0}
    assert hmmt.score(r"<think>maybe \boxed{1/2}</think>I am unsure.", half) == {"correct": 0.0, "boxed": 0.0}
    assert hmmt.score(r"<think>maybe \boxed{7}</think>So \boxed{1/2}.", half)["correct"] == 1.0
    aime = task("aime_2024", samples=1)
    assert aime.score(r"\boxed{024}", aime.examples(tokenizer)[1])["correct"] == 1.0


def record(subtask: str, problem: str, sample: int, correct: float) -> dict:
    return {
        "subtask": subtask,
        "example_id": f"{subtask}/{problem}/s{sample}",
        "meta": {"problem_id": problem, "sample": sample},
        "metrics": {"correct": correct, "boxed": 1.0},
        "new_tokens": 2, "decode_s": 1.0, "score_s": 0.0, "prefill_s": 0.0, "prefill_len": 10,
        "kv_bytes_final": 1, "kv_bytes_full": 2,
    }  # fmt: skip


def test_pass_at_1_is_the_harness_mean_when_every_problem_has_k_samples() -> None:
    outcomes = {"1": [1, 1, 0, 1], "2": [0, 0, 0, 0], "3": [1, 0, 0, 0]}
    records = [record("aime_2025", p, j, c) for p, cs in outcomes.items() for j, c in enumerate(cs)]
    expected = (3 / 4 + 0 + 1 / 4) / 3
    assert pass_at_1(records) == {"aime_2025": pytest.approx(expected)}
    assert summarize(records)["subtasks"]["aime_2025"]["correct"] == pytest.approx(expected)
    # An incomplete run: problem 3 has one sample so far; pass@1 still weighs problems equally.
    partial = records[:8] + records[8:9]
    assert pass_at_1(partial)["aime_2025"] == pytest.approx((3 / 4 + 0 + 1) / 3)


def test_greedy_decoding_with_several_samples_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        task("aime_2024", samples=4, sampling_temperature=0.0)
    assert "sampling.temperature=0.6 sampling.top_p=0.95" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        task("aime_2024", samples=4, sampling_temperature=0.6)
        task("aime_2024", samples=1, sampling_temperature=0.0)
    assert caplog.text == ""


def test_missing_local_file_says_how_to_get_it(tmp_path: Path) -> None:
    missing = MathTask(competitions=["hmmt_nov_2025"], data_file=str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"MathArena/hmmt_nov_2025.*task\.data_file="):
        missing.problems("hmmt_nov_2025")
    with pytest.raises(FileNotFoundError, match=r"hmmt_feb_2025\.jsonl"):
        MathTask(competitions=["hmmt_feb_2025"], data_file=str(tmp_path)).problems("hmmt_feb_2025")


def test_unreachable_hub_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    hub = MathTask(competitions=["aime_2025"], revisions={"aime_2025": "abc123"})
    with pytest.raises(FileNotFoundError, match=r"MathArena/aime_2025@abc123.* — .*to_json\('aime_2025\.jsonl'\)"):
        hub.problems("aime_2025")


def test_rows_outside_the_schema_are_refused(tmp_path: Path) -> None:
    wrong = tmp_path / "aime_2025.jsonl"
    wrong.write_text('{"question": "1+1?", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"lack the fields \['problem', 'problem_idx'\]"):
        MathTask(competitions=["aime_2025"], data_file=str(wrong)).problems("aime_2025")


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown competition"):
        MathTask(competitions=["aime_2030"])
    with pytest.raises(ValueError, match="once each"):
        MathTask(competitions=["aime_2024", "aime_2024"])
    with pytest.raises(ValueError, match="samples"):
        MathTask(samples=0)
    with pytest.raises(ValueError, match="thinking"):
        MathTask(thinking="yes")
    with pytest.raises(ValueError, match="one file but 2 competitions"):
        MathTask(data_file=str(FIXTURES / "aime_2024.jsonl"))


def test_identity_holds_protocol_not_selection() -> None:
    base = MathTask().identity()
    assert MathTask(samples=2, n=3, competitions=["aime_2025"], sampling_temperature=0.6).identity() == base
    assert MathTask(max_new_tokens=1024).identity() != base
    assert MathTask(thinking=False).identity() != base
    assert MathTask(revisions={"aime_2024": "abc"}).identity() != base


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {"competitions": ["aime_2030"]},
            "task.competitions=['aime_2030'] names an unknown competition 'aime_2030' — choose from aime_2024,",
        ),
        ({"competitions": []}, "task.competitions=[] must list competitions once each — "),
        (
            {"revisions": {"aime_2030": "main"}},
            "task.revisions has the key 'aime_2030', not a competition on the hub — choose from aime_2024,",
        ),
        ({"revisions": {"aime_2024": 1234}}, "task.revisions.aime_2024=1234 is not a string — quote it"),
        ({"revisions": "main"}, "task.revisions='main' is not a mapping — "),
        ({"samples": "abc"}, "task.samples='abc' must be an integer >= 1 — use e.g. task.samples=16"),
        ({"n": 0}, "task.n=0 must be null or an integer >= 1 — "),
        ({"max_new_tokens": 1.5}, "task.max_new_tokens=1.5 must be an integer >= 1 — "),
        ({"thinking": "yes"}, "task.thinking='yes' must be null, true or false — use e.g. task.thinking=false"),
        ({"data_file": 42}, "task.data_file=42 is not a string — quote it"),
        ({"origin": "mirror"}, "task.origin='mirror' is not one of auto, hub — use task.origin=auto"),
        ({"require_complete": "yes"}, "task.require_complete='yes' must be true or false — "),
        ({"revisions": {"math500": "main"}}, "task.revisions has the key 'math500', not a competition on the hub"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: MathTask(**options), named)


def test_repeated_problem_ids_are_refused(tmp_path: Path) -> None:
    twice = tmp_path / "aime_2025.jsonl"
    twice.write_text('{"problem_idx": 1, "problem": "1+1?", "answer": "2"}\n' * 2)
    with pytest.raises(ValueError, match=re.escape("aime_2025: problem ids ['1'] in field 'problem_idx' repeat — ")):
        MathTask(competitions=["aime_2025"], data_file=str(twice)).problems("aime_2025")
