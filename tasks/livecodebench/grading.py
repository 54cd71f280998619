"""LiveCodeBench's grading (``lcb_runner/evaluation/testing_util.py``, ``utils/extraction_utils.py``), run through
the sandbox.

- The code is the first fenced block of the answer (after a final ``</think>``); none: a failure.
- A solution passes when it passes every public and private test; the first failing test ends
  the run. Standard-input tests compare stripped output lines, exactly or as lists of decimals;
  functional (LeetCode) tests call ``Solution().<fn_name>(*args)`` with one JSON argument per
  input line and compare with the JSON output (a tuple counts as a list).
- Each test runs in its own sandbox (``tasks.livecodebench.sandbox``), given only its input; the
  comparison happens here, so no expected output ever reaches the code. One difference from
  LiveCodeBench follows: nothing carries over from one test to the next (LiveCodeBench calls one
  ``Solution()`` instance for all tests, and keeps module state between stdin tests), so neither
  can a solution answer by the order of the tests.
- Private tests are stored JSON, or base64 of zlib of a pickled JSON string; the pickle is read
  by an unpickler that resolves no class, so it can only ever yield plain data.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from tasks.livecodebench.sandbox import Limits, run

THINK_END = "</think>"


def extract_code(answer: str) -> str:
    """The lines between the first two lines that hold a triple backtick (LiveCodeBench's ``extract_code``)."""
    lines = answer.rsplit(THINK_END, 1)[-1].split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    return "\n".join(lines[fences[0] + 1 : fences[1]]) if len(fences) >= 2 else ""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"test data refers to {module}.{name}; only plain data is read")


def decode_tests(raw: str) -> list[dict[str, str]]:
    """A row's test cases: JSON, or base64(zlib(pickle(JSON text))) as the lite dataset stores private ones."""
    try:
        return json.loads(raw)
    except ValueError:
        pass
    text = _PlainUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(raw.encode("utf-8"))))).load()
    return json.loads(text)


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(item) for item in line.split()]
    except InvalidOperation:
        return None


def stdout_matches(output: str, expected: str) -> bool:
    """Line by line after stripping: equal, or equal as lists of decimals (``grade_stdio``)."""
    got, want = _stripped_lines(output), _stripped_lines(expected)
    if len(got) != len(want):
        return False
    for line, reference in zip(got, want, strict=True):
        if line == reference:
            continue
        a, b = _decimals(line), _decimals(reference)
        if a is None or b is None or a != b:
            return False
    return True


def result_matches(output: Any, expected: str) -> bool:
    """A functional test: the returned value equals the JSON output (``grade_call_based``)."""
    return output == json.loads(expected)


@dataclass(frozen=True)
class Verdict:
    """Whether a solution passed, how many tests it passed before the first failure, and why it stopped."""

    passed: bool
    tests_passed: int
    tests: int
    reason: str


def grade(code: str, tests: list[dict[str, str]], fn_name: str | None, limits: Limits) -> Verdict:
    """Run ``code`` on ``tests`` in the sandbox, stopping at the first failure."""
    if not code.strip():
        return Verdict(False, 0, len(tests), "no code block")
    functional = fn_name is not None
    job = {
        "code": code,
        "mode": "functional" if functional else "stdin",
        "fn_name": fn_name,
        "inputs": [test["input"] for test in tests],
        "timeout": limits.test_timeout_s,
    }
    compare = result_matches if functional else stdout_matches
    passed = 0
    results = run(job, limits)
    try:
        for outcome in results:
            if "output" not in outcome:
                return Verdict(False, passed, len(tests), "timeout" if outcome.get("timeout") else outcome["error"])
            if not compare(outcome["output"], tests[passed]["output"]):
                return Verdict(False, passed, len(tests), "wrong answer")
            passed += 1
            if passed == len(tests):
                return Verdict(True, passed, len(tests), "passed")
    finally:
        results.close()
    return Verdict(False, passed, len(tests), "the run ended early")
