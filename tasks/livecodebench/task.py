"""LiveCodeBench v6 code generation (Jain et al. 2024, arXiv:2403.07974), pass@1 in a sandbox.

Problems are rows of ``livecodebench/code_generation_lite`` (LeetCode, AtCoder, Codeforces), read
from the release's JSON-lines files at a pinned commit or from a local copy in the same schema.
Our reading of "LiveCodeBench v6" (KVpop, Table 2; DMS's protocol): the problems release v6 added,
``test6.jsonl``; ``task.files=[test.jsonl,...,test6.jsonl]`` reads the whole ``release_v6``
instead. The prompt is LiveCodeBench's code-generation prompt for chat models (its system message,
the question, the starter code or the stdin format, "### Answer"); ``correct`` = 1 when the first
fenced code block of the answer passes every public and private test in the sandbox
(``tasks.livecodebench.sandbox``), and pass@1 is its mean over ``samples`` samples per problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.base import Example, Task, as_list, require_int, require_str
from tasks.digest import content_digest
from tasks.hub import load_rows
from tasks.livecodebench.grading import decode_tests, extract_code, grade
from tasks.livecodebench.sandbox import Limits, check_available
from tasks.math.task import encode

HUB_ID = "livecodebench/code_generation_lite"
FIELDS = ("question_id", "question_content", "starter_code", "public_test_cases", "private_test_cases", "metadata")
SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) and will "
    "generate a correct Python program that matches the specification and passes all tests."
)
STARTER = (
    "### Format: You will use the following starter code to write the solution to the problem and enclose your "
    "code within delimiters.\n```python\n{starter}\n```\n\n"
)
STDIN = (
    "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
    "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program "
    "runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
)
ANSWER = "### Answer: (use the provided format with backticks)\n\n"


def build_prompt(question: str, starter: str) -> str:
    """LiveCodeBench's user turn: the question, the format, the answer cue."""
    return f"### Question:\n{question}\n\n" + (STARTER.format(starter=starter) if starter else STDIN) + ANSWER


@dataclass
class LiveCodeBenchTask(Task):
    """``task=livecodebench``: pass@1 of sandboxed solutions over ``samples`` per problem.

    Parameters:
        files: release files of the hub repository to read (``test6.jsonl``: the problems of v6).
        revision: the hub commit to read; required unless ``data_file`` is given.
        data_file: a local JSON-lines file in the hub's schema, replacing the hub.
        n: the first ``n`` problems (None: all).
        samples: generations per problem (pass@1 is their mean).
        max_new_tokens: generation budget per sample.
        thinking: ``enable_thinking`` for chat templates that take it (Qwen3).
        sandbox: ``Limits`` of one sandboxed run (per-test timeout, memory, file size, processes).
    """

    name: str = "livecodebench"
    files: list[str] = field(default_factory=lambda: ["test6.jsonl"])
    revision: str | None = None
    data_file: str | None = None
    n: int | None = None
    samples: int = 1
    max_new_tokens: int = 32768
    thinking: bool | None = None
    sandbox: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.files = [str(name) for name in as_list("files", self.files)]
        if not self.files:
            raise ValueError("task.files=[] names no release file — use e.g. task.files=[test6.jsonl]")
        require_str("revision", self.revision)
        require_str("data_file", self.data_file)
        require_int("n", self.n, optional=True, example=10)
        require_int("samples", self.samples, example=1)
        require_int("max_new_tokens", self.max_new_tokens, example=32768)
        self.limits = Limits(**dict(self.sandbox))
        self._tests: dict[str, tuple[list[dict[str, str]], str | None]] = {}

    def identity(self) -> dict[str, Any]:
        return {
            "source": f"{HUB_ID}@{self.revision}:{','.join(self.files)}",
            "data_file": content_digest(self.data_file, "task.data_file"),
            "system": SYSTEM,
            "max_new_tokens": self.max_new_tokens,
            "thinking": self.thinking,
            "sandbox": self.limits.__dict__,
        }

    def how_to_get(self) -> str:
        return (
            f"pin a commit of {HUB_ID} with task.revision=<sha> (its files {self.files} are read through `datasets`), "
            "or pass task.data_file=<local .jsonl of its rows>"
        )

    def problems(self) -> list[dict[str, Any]]:
        if self.data_file is not None:
            rows = load_rows("json", split="test", revision=None, local_file=Path(self.data_file),
                             how_to_get=self.how_to_get())  # fmt: skip
        elif self.revision is None:
            raise ValueError(f"task=livecodebench reads the hub without task.revision — {self.how_to_get()}")
        else:
            rows = [
                row
                for name in self.files
                for row in _hub_rows(f"hf://datasets/{HUB_ID}@{self.revision}/{name}", self.how_to_get())
            ]
        missing = sorted({key for row in rows for key in FIELDS if key not in row})
        if missing:
            raise ValueError(f"livecodebench rows lack the fields {missing} — {self.how_to_get()}")
        return rows if self.n is None else rows[: self.n]

    def examples(self, tokenizer: Any) -> list[Example]:
        # Before the model loads: without a sandbox that holds (and hides the data) nothing is graded.
        check_available(*([self.data_file] if self.data_file is not None else []))
        examples = []
        for row in self.problems():
            question = str(row["question_id"])
            tests = decode_tests(row["public_test_cases"]) + decode_tests(row["private_test_cases"])
            functional = bool(tests) and tests[0].get("testtype") == "functional"
            fn_name = json.loads(row["metadata"] or "{}").get("func_name") if functional else None
            self._tests[question] = (tests, fn_name)
            ids = encode(tokenizer, build_prompt(row["question_content"], row["starter_code"]), self.thinking, SYSTEM)
            examples.extend(
                Example(
                    example_id=f"{question}/s{sample}",
                    subtask=self.name,
                    input_ids=ids,
                    answers=[],
                    max_new_tokens=self.max_new_tokens,
                    meta={
                        "question_id": question,
                        "sample": sample,
                        "tests": len(tests),
                        "difficulty": row.get("difficulty"),
                        "platform": row.get("platform"),
                    },
                )  # fmt: skip
                for sample in range(self.samples)
            )
        return examples

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        tests, fn_name = self._tests[example.meta["question_id"]]
        verdict = grade(extract_code(prediction), tests, fn_name, self.limits)
        return {"correct": float(verdict.passed), "tests_passed": verdict.tests_passed / max(verdict.tests, 1)}


def _hub_rows(url: str, how_to_get: str) -> list[dict[str, Any]]:
    """The rows of one release file at a pinned commit (``hf://`` through ``datasets``)."""
    from datasets import load_dataset

    try:
        return [dict(row) for row in load_dataset("json", data_files={"test": url}, split="test")]
    except Exception as error:  # offline, a missing commit or file: all mean "not available"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"could not read {url} ({reason}) — {how_to_get}") from error
