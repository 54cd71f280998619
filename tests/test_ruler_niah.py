"""RULER niah synthesis and scoring, with the real SmolLM2 tokenizer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hydra.utils
import pytest
from omegaconf import OmegaConf

from harness.config import model_spec
from harness.models import load_tokenizer
from tasks.digest import file_sha256
from tasks.ruler.niah import NEEDLE, NOISE, SUBTASKS, TOKENS_TO_GENERATE
from tasks.ruler.scoring import string_match_all, string_match_part
from tasks.ruler.task import RulerTask

ROOT = Path(__file__).resolve().parents[1]
NOISE_FREE = ["niah_single_1", "niah_multikey_2", "niah_multikey_3"]
ESSAY = [name for name, config in SUBTASKS.items() if config.haystack == "essay"]
NUMBER = re.compile(r"\b\d{7}\b")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\b")


@pytest.fixture(scope="module")
def tok() -> Any:
    spec = model_spec("smollm2_135m")
    return load_tokenizer(spec)


@pytest.fixture(scope="module")
def essay_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    lines = [
        f"Paragraph {i} describes the {thing} in plain words. Why does it matter? Nobody knows!"
        for i, thing in enumerate(["harbor", "orchard", "lantern", "meadow", "violin"] * 120)
    ]
    path = tmp_path_factory.mktemp("essay") / "essay.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def needles_of(text: str) -> list[str]:
    return re.findall(r"One of the special magic \w+ for [^:]+ is: [^.\n]+\.", text)


@pytest.mark.parametrize("length", [512, 1024, 4096])
def test_prompt_fills_the_length(tok: Any, length: int) -> None:
    examples = RulerTask(tasks=NOISE_FREE, lengths=[length], n=2).examples(tok)
    budget = length - TOKENS_TO_GENERATE
    for ex in examples:
        assert len(ex.input_ids) == ex.meta["prompt_tokens"] <= budget
        assert ex.max_new_tokens == TOKENS_TO_GENERATE == 128
        # Haystacks grow in whole lines, so the shortfall is under a few percent or one line.
        text = tok.decode(ex.input_ids)
        line = max(needles_of(text) + [NOISE], key=lambda s: len(tok(s)["input_ids"]))
        slack = max(0.05 * length, len(tok(line)["input_ids"]) + 2)
        assert budget - len(ex.input_ids) <= slack, (ex.example_id, len(ex.input_ids))


def test_needles_answers_and_template(tok: Any) -> None:
    task = RulerTask(tasks=NOISE_FREE, lengths=[1024], n=3)
    for ex in task.examples(tok):
        text = tok.decode(ex.input_ids)
        config = SUBTASKS[ex.subtask]
        assert ex.example_id == f"{ex.subtask}/1024/{ex.example_id[-4:]}"
        # Chat template around the prompt, RULER's answer prefix right after the assistant header.
        assert text.startswith("<|im_start|>system\n")
        match = re.search(
            r"<\|im_start\|>assistant\n The special magic (\w+) for (\S+) mentioned in the provided text is$",
            text,
        )
        assert match, text[-300:]
        assert match.group(1) == config.type_needle_v[:-1]
        key = match.group(2)
        assert f"What is the special magic {match.group(1)} for {key} mentioned in the provided text?<|im_end|>" in text
        assert text.count(f"A special magic {match.group(1)} is hidden within the following text.") == 1

        [answer] = ex.answers
        needle = NEEDLE.format(type_needle_v=config.type_needle_v, key=key, value=answer)
        assert text.count(needle) == 1
        assert text.count(answer) == 1
        value_pattern = UUID if config.type_needle_v == "uuids" else NUMBER
        assert value_pattern.fullmatch(answer)
        if config.type_needle_k == "words":
            assert re.fullmatch(r"[a-z]+-[a-z]+", key)
        if config.haystack == "noise":
            assert len(needles_of(text)) == 1
            assert text.count(NOISE) == ex.meta["num_haystack"]
        else:
            # Distractor needles with other keys fill the haystack.
            found = needles_of(text)
            assert len(found) == ex.meta["num_haystack"] + 1
            assert sum(f" for {key} is:" in n for n in found) == 1
        assert len(ex.meta["depths"]) == 1 and 0 <= ex.meta["depths"][0] < 100


def test_essay_subtasks(tok: Any, essay_file: str) -> None:
    examples = RulerTask(tasks=ESSAY, lengths=[1024], n=2, haystack_file=essay_file).examples(tok)
    for ex in examples:
        config = SUBTASKS[ex.subtask]
        text = tok.decode(ex.input_ids)
        assert ex.meta["prompt_tokens"] <= 1024 - TOKENS_TO_GENERATE
        assert len(ex.answers) == config.num_needle_v * config.num_needle_q
        found = needles_of(text)
        assert len(found) == config.num_keys * config.num_needle_v == len(ex.meta["depths"])
        for answer in ex.answers:
            assert sum(answer in n for n in found) == 1
            assert text.count(answer) == 1
        assert "Paragraph 0 describes the harbor" in text
        if config.singular:
            assert text.endswith("mentioned in the provided text is")
        else:
            assert "Some special magic numbers are hidden" in text
            assert text.endswith("mentioned in the provided text are")
    multiquery = next(ex for ex in examples if ex.subtask == "niah_multiquery")
    assert re.search(
        r"for \S+, \S+, \S+, and \S+ mentioned in the provided text are$", tok.decode(multiquery.input_ids)
    )


def test_determinism_and_prefix(tok: Any) -> None:
    three = RulerTask(tasks=["niah_single_1", "niah_multikey_2"], lengths=[512], n=3).examples(tok)
    five = RulerTask(tasks=["niah_multikey_2", "niah_single_1"], lengths=[512], n=5).examples(tok)
    by_id = {ex.example_id: ex for ex in five}
    for ex in three:
        assert ex.input_ids == by_id[ex.example_id].input_ids
        assert ex.answers == by_id[ex.example_id].answers
    values = [ex.answers[0] for ex in five if ex.subtask == "niah_single_1"]
    assert len(set(values)) == 5
    other_seed = RulerTask(lengths=[512], n=3, seed=1).examples(tok)
    assert [ex.answers for ex in other_seed] != [ex.answers for ex in three if ex.subtask == "niah_single_1"]


def test_raw_prompt_without_chat_template(tok: Any) -> None:
    [ex] = RulerTask(lengths=[512], n=1, chat_template=False).examples(tok)
    text = tok.decode(ex.input_ids)
    assert text.startswith("A special magic number is hidden within the following text.")
    assert "<|im_start|>" not in text
    key = re.search(r"What is the special magic number for (\S+) mentioned", text).group(1)
    assert text.endswith(
        f"for {key} mentioned in the provided text? "
        f"The special magic number for {key} mentioned in the provided text is"
    )


def test_score_uses_string_match_all(tok: Any) -> None:
    [ex] = RulerTask(tasks=["niah_single_1"], lengths=[512], n=1).examples(tok)
    assert RulerTask().score(f" {ex.answers[0]}.", ex) == {"string_match_all": 100.0}
    assert RulerTask().score("I do not know.", ex) == {"string_match_all": 0.0}


def test_string_match_all() -> None:
    assert string_match_all("The Answer is FOO-Bar", ["foo-bar"]) == 100.0
    assert string_match_all("1234567 and nothing else", ["1234567", "7654321"]) == 50.0
    assert string_match_all("", ["1234567"]) == 0.0
    assert string_match_all("  \x00\t1234567\n ", ["1234567"]) == 100.0
    assert string_match_all("a\x01b", ["a\nb"]) == 100.0


def test_string_match_part() -> None:
    assert string_match_part("It was PARIS.", ["London", "paris"]) == 100.0
    assert string_match_part("It was Rome.", ["London", "paris"]) == 0.0
    assert string_match_part("", ["paris"]) == 0.0


def test_validation() -> None:
    with pytest.raises(ValueError, match="niah_single_9") as info:
        RulerTask(tasks=["niah_single_9"])
    for name in SUBTASKS:
        assert name in str(info.value)
    for lengths in ([0], [-5], [1.5], [TOKENS_TO_GENERATE]):
        with pytest.raises(ValueError, match="task.lengths"):
            RulerTask(lengths=lengths)
    with pytest.raises(ValueError, match="task.n"):
        RulerTask(n=0)
    # Essay subtasks default to the bundled public-domain corpus; a bad path fails clearly.
    assert RulerTask(tasks=ESSAY).haystack_file is None
    with pytest.raises(FileNotFoundError, match="task.haystack_file='/nonexistent.txt'"):
        RulerTask(tasks=["niah_single_2"], lengths=[512], n=1, haystack_file="/nonexistent.txt").examples(None)


def test_identity_is_protocol_only() -> None:
    a = RulerTask(tasks=["niah_single_1"], lengths=[512], n=3)
    b = RulerTask(tasks=["niah_single_1", "niah_multikey_2"], lengths=[512, 1024], n=7)
    assert a.identity() == b.identity() == {"seed": 42, "chat_template": True, "haystack_file": None}
    assert RulerTask(seed=3).identity() != a.identity()
    assert RulerTask.name == "ruler"


def test_hydra_config_instantiates() -> None:
    cfg = OmegaConf.load(ROOT / "conf/task/ruler.yaml")
    task = hydra.utils.instantiate(cfg)
    assert isinstance(task, RulerTask)
    assert (task.tasks, task.lengths, task.n, task.seed) == (["niah_single_1"], [1024], 10, 42)
    assert task.chat_template is True and task.haystack_file is None
    assert type(task.tasks) is list and type(task.lengths) is list


def test_essay_haystack_from_a_hub_text_dataset(tok) -> None:
    fixture = Path(__file__).parent / "fixtures" / "ppl" / "wikitext_test.jsonl"
    hub = {"path": "wikitext", "name": "wikitext-103-raw-v1", "split": "test", "data_files": str(fixture)}
    task = RulerTask(tasks=["niah_single_2"], lengths=[512], n=1, haystack_hub=hub)
    [example] = task.examples(tok)
    assert "harbour of Avonlea" in tok.decode(example.input_ids)
    assert task.identity()["haystack_hub"] == {**hub, "data_files": f"sha256:{file_sha256(fixture)}"}
    with pytest.raises(ValueError, match="task.haystack_file or task.haystack_hub, not both"):
        RulerTask(haystack_file="essays.txt", haystack_hub=hub)
