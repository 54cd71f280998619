"""LiveCodeBench: rows of the hub schema, LiveCodeBench's grading, and a sandbox that contains what code does."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from hydra.utils import instantiate

from harness.config import compose_config
from tasks.base import Example
from tasks.livecodebench.grading import decode_tests, extract_code, grade, stdout_matches
from tasks.livecodebench.sandbox import Limits, check_available
from tasks.livecodebench.task import SYSTEM, LiveCodeBenchTask

FIXTURE = Path(__file__).parent / "fixtures" / "livecodebench" / "test6.jsonl"
QUICK = Limits(test_timeout_s=1, memory_mb=1024)


class Tokenizer:
    """A template-less tokenizer: one id per character, so prompts can be read back."""

    chat_template = None

    def __call__(self, text: str, **_: object) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def require_sandbox() -> None:
    """Fail without a working sandbox as root, as in CI (`make test-system` installs bubblewrap); skip otherwise."""
    try:
        check_available()
    except ValueError as error:
        reason = f"the LiveCodeBench sandbox is unavailable here: {error}"
        if os.geteuid() == 0:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def sandboxed() -> None:
    require_sandbox()


def fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def task() -> tuple[LiveCodeBenchTask, list[Example]]:
    require_sandbox()
    cfg = compose_config(
        "task=livecodebench", f"task.data_file={FIXTURE}", "task.samples=2", "task.sandbox.test_timeout_s=2"
    )
    lcb = instantiate(cfg.task)
    return lcb, lcb.examples(Tokenizer())


def test_examples_follow_the_rows_and_the_prompt(task) -> None:
    lcb, examples = task
    assert [e.example_id for e in examples] == [
        "abc400_a/s0",
        "abc400_a/s1",
        "3500/s0",
        "3500/s1",
        "2090A/s0",
        "2090A/s1",
    ]
    prompt = "".join(map(chr, examples[2].input_ids))
    assert prompt.startswith(SYSTEM + "\n\n### Question:\nGiven an integer array nums")
    assert "```python\nclass Solution:\n    def maxElement" in prompt and prompt.endswith(
        "### Answer: (use the provided format with backticks)\n\n"
    )
    assert "Read the inputs from stdin" in "".join(map(chr, examples[0].input_ids))
    assert examples[0].meta["tests"] == 3 and examples[2].meta["tests"] == 2


def test_correct_and_wrong_solutions_are_scored(task) -> None:
    lcb, examples = task
    stdin, functional, decimal = examples[0], examples[2], examples[4]
    adds = "a, b = map(int, input().split())\nprint(a + b)"
    assert lcb.score(fenced(adds), stdin) == {"correct": 1.0, "tests_passed": 1.0}
    assert lcb.score(fenced("a, b = map(int, input().split())\nprint(a - b)"), stdin)["correct"] == 0.0
    assert lcb.score("no code at all", stdin) == {"correct": 0.0, "tests_passed": 0.0}
    solution = "class Solution:\n    def maxElement(self, nums: List[int]) -> int:\n        return max(nums)"
    assert lcb.score(fenced(solution), functional)["correct"] == 1.0
    assert lcb.score(fenced(solution.replace("max(", "min(")), functional)["correct"] == 0.0
    # 2.5 and 2.50 are the same decimal
    assert lcb.score(fenced("print(float(input()) / 2)"), decimal)["correct"] == 1.0
    # the code of a thinking model comes after its reasoning
    assert extract_code("<think>```python\nwrong\n```</think>" + fenced("right")) == "right"


def test_private_tests_are_decoded_without_resolving_classes() -> None:
    tests = decode_tests(
        FIXTURE.read_text().splitlines()[0].split('"private_test_cases": ')[1].split(",")[0].strip('"')
    )
    assert tests[0] == {"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}
    assert stdout_matches("1.5 2\n", "1.50 2.0") and not stdout_matches("1.5\n2", "1.5")


STDIN_TEST = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("while True:\n    pass", "timeout"),
        ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
        ("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])", "not allowed"),
        ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\nprint(1)", "not allowed"),
    ],
)
def test_the_sandbox_contains_loops_forks_and_network_and_fails_them(code: str, reason: str, sandboxed: None) -> None:
    verdict = grade(code, STDIN_TEST, None, QUICK)
    assert not verdict.passed and verdict.tests_passed == 0
    assert re.search(reason, verdict.reason), verdict.reason


def test_a_write_outside_the_sandbox_fails_and_leaves_nothing(tmp_path: Path, sandboxed: None) -> None:
    target = Path("/tmp") / f"evb-escape-{uuid.uuid4().hex}"
    for code in (f"open({str(target)!r}, 'w').write('x')\nprint(1)", f"import os\nos.mkdir({str(target)!r})\nprint(1)"):
        verdict = grade(code, STDIN_TEST, None, QUICK)
        assert not verdict.passed and "outside the sandbox is not allowed" in verdict.reason
        assert not target.exists()
    # inside its own folder the code may write
    assert grade("open('scratch.txt', 'w').write('x')\nprint(1)", STDIN_TEST, None, QUICK).passed


def test_writing_on_the_result_channel_cannot_fake_a_pass(sandboxed: None) -> None:
    forged = 'import os\nos.write(1, b\'{"output": "1\\\\n"}\\n\')'
    assert not grade(forged, STDIN_TEST, None, QUICK).passed


def test_bad_options_are_one_line() -> None:
    with pytest.raises(ValueError, match=re.escape("task.sandbox.memory_mb=0 must be an integer >= 1 — use e.g. 6")):
        LiveCodeBenchTask(sandbox={"memory_mb": 0})
    with pytest.raises(ValueError, match=re.escape("reads the hub without task.revision — pin a commit")):
        LiveCodeBenchTask().problems()
