"""``task.sizing``: the tight fit (default, run ids unchanged) and RULER's own sizing (NVIDIA/RULER 533f013)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_line

from harness.config import model_spec
from harness.models import load_tokenizer
from tasks.ruler import freq_words
from tasks.ruler.fit import linear_size
from tasks.ruler.task import RulerTask

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ruler"
QA_FILES = {"qa_1": str(FIXTURES / "squad_v2_validation.jsonl")}


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(model_spec("smollm2_135m"))


def test_rulers_sizing_enters_the_identity_and_the_tight_fit_does_not() -> None:
    assert "sizing" not in RulerTask().identity()
    assert RulerTask(sizing="tight").identity() == RulerTask().identity()
    assert RulerTask(sizing="ruler").identity()["sizing"] == "ruler"
    with pytest.raises(ValueError, match=re.escape("task.sizing='exact' is not a sizing — use task.sizing=tight")) as e:
        RulerTask(sizing="exact")
    assert_one_line(str(e.value))


def test_linear_search_stops_one_step_below_the_first_size_that_reaches_the_budget() -> None:
    # Ten tokens per unit: 95 units reach 950; RULER steps back to 85 although 94 would fit.
    size = linear_size(lambda num: 10 * num, 945, start=5, step=10)
    assert size is not None and size.num_haystack == 85
    assert linear_size(lambda num: 10 * num, 40, start=5, step=10) is None


def test_rulers_sizing_keeps_one_size_and_drops_rulers_step(tok: Any) -> None:
    tasks = ["niah_single_1", "vt", "cwe", "fwe", "qa_1"]
    tight = RulerTask(tasks=tasks, lengths=[1024], n=3, data_files=QA_FILES).examples(tok)
    ruler = RulerTask(tasks=tasks, lengths=[1024], n=3, data_files=QA_FILES, sizing="ruler").examples(tok)
    assert [ex.example_id for ex in tight] == [ex.example_id for ex in ruler]
    for ours, theirs in zip(tight, ruler, strict=True):
        assert len(theirs.input_ids) + theirs.max_new_tokens <= 1024
        assert len(theirs.input_ids) <= len(ours.input_ids) or ours.subtask == "niah_single_1", ours.example_id
    # fwe: RULER's linear search, from (length - 50) // 6 words in steps of (length - 50) // 32.
    config = freq_words.FweConfig()
    start, step = config.start(1024), config.step(1024)
    for ex in ruler:
        if ex.subtask == "fwe":
            assert (ex.meta["num_haystack"] - start) % step == 0
        if ex.subtask in ("cwe", "qa_1"):
            sizes = {e.meta["num_haystack"] for e in ruler if e.subtask == ex.subtask}
            # One size per subtask and length, less whole steps where an example overflows.
            assert all((max(sizes) - size) % 10 == 0 for size in sizes)
