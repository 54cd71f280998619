"""scripts/ruler_peer_check.py's reading of prompts: both sides' prompts are parsed by one function."""

from __future__ import annotations

from typing import Any

import pytest
import ruler_peer_check as peer

from harness.config import model_spec
from harness.models import load_tokenizer
from tasks.ruler.task import RulerTask


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(model_spec("smollm2_135m"))


def test_template_differences_name_the_words() -> None:
    assert peer.text_difference("a b c", "a b c") == "identical"
    assert peer.text_difference("are assigned the", "are assgined the") == "'assgined' -> 'assigned'"


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_2", "niah_single_2", "vt", "cwe", "fwe"])
def test_haystack_units_read_from_our_prompts_match_what_we_built(tok: Any, task: str) -> None:
    for example in RulerTask(tasks=[task], n=2, chat_template=False).examples(tok):
        units = peer.haystack_units(task, tok.decode(example.input_ids))
        if task == "fwe":
            # The nominal list size rounds each rank's count down.
            assert 0.9 * example.meta["num_haystack"] <= units <= example.meta["num_haystack"]
        elif task == "niah_single_2":
            # Essay words, as whitespace splits them (the needle sentence taken out).
            assert abs(units - example.meta["num_haystack"]) <= 2
        else:
            assert units == example.meta["num_haystack"]
