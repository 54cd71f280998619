"""LongBench-v2 as the harness sees it, following the official ``pred.py`` and ``result.py``.

Per question: the official 0-shot (or CoT) template, middle truncation of its tokenisation to
``max_length`` tokens, the chat template (the official script always sends a chat message),
and ``acc`` = 1 when the official answer regex finds the gold letter, else 0. Unlike pred.py,
which skips a question whose API call returned an empty string, an empty or unparseable output
is recorded and scores 0: dropping it would inflate the accuracy of a degraded cache.

Every record has the subtask ``longbench_v2``, so the harness's overall mean is the official
overall accuracy; ``meta`` carries ``difficulty`` (easy/hard), ``length`` (short/medium/long),
``domain`` and ``sub_domain`` for result.py's breakdowns.

``cot=True`` runs the first CoT pass only (0shot_cot.txt, 1024 new tokens) and applies the
answer regex to that reasoning. The official protocol then makes a second, document-free call
(0shot_cot_ans.txt: the question, the reasoning, and "what is the single, most likely answer
choice?") and extracts the letter from it; one example is one generation here, so a reasoning
that never states "The correct answer is ..." scores 0 where the second pass might rescue it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tasks.base import Example, Task, require_int
from tasks.hub import load_rows
from tasks.longbench.prompting import encode, truncate_middle
from tasks.longbench_v2.protocol import (
    MAX_NEW_TOKENS,
    MAX_NEW_TOKENS_COT,
    TEMPLATE_0SHOT,
    TEMPLATE_0SHOT_COT,
    extract_answer,
    fill,
)

SUBTASK = "longbench_v2"
HUB_SCHEMA = (
    "_id",
    "domain",
    "sub_domain",
    "difficulty",
    "length",
    "question",
    "choice_A",
    "choice_B",
    "choice_C",
    "choice_D",
    "answer",
    "context",
)


@dataclass
class LongBenchV2Task(Task):
    """LongBench-v2's 503 multiple-choice questions.

    Parameters:
        cot: chain-of-thought template (first official pass only, see the module docstring).
        n: first ``n`` questions (``None``: all 503).
        max_length: prompt tokens kept by middle truncation; the official value is 120000
            (``config/model2maxlen.json`` for 128k-context models).
        chat_template: wrap the prompt in the tokenizer's chat template.
        hub_id: hub dataset with the official ``data.json`` (split ``train``).
        revision: the hub revision to read.
        data_dir: local folder holding the hub's ``data.json`` (same schema), used instead of the hub when set.
    """

    name: ClassVar[str] = "longbench_v2"

    cot: bool = False
    n: int | None = None
    max_length: int = 4096
    chat_template: bool = True
    hub_id: str = "zai-org/LongBench-v2"
    revision: str | None = "2b48e494f2c7a2f0af81aae178e05c7e1dde0fe9"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        require_int("n", self.n, optional=True)
        require_int("max_length", self.max_length, minimum=2)

    def identity(self) -> dict[str, Any]:
        return {
            "cot": self.cot,
            "max_length": self.max_length,
            "chat_template": self.chat_template,
            "hub_id": self.hub_id,
            "revision": self.revision,
            "data_dir": self.data_dir,
        }

    def how_to_get(self) -> str:
        """What to do when the questions cannot be loaded."""
        return (
            f"LongBench-v2 data: either go online once so `datasets` caches the hub dataset "
            f"{self.hub_id} (formerly THUDM/LongBench-v2) at revision {self.revision}, or download its "
            f"data.json and pass task.data_dir=<the folder holding data.json>."
        )

    def records(self) -> list[dict[str, Any]]:
        """The questions in the hub schema, first ``n`` only."""
        rows = load_rows(
            hub_id=self.hub_id,
            revision=self.revision,
            split="train",
            local_file=Path(self.data_dir) / "data.json" if self.data_dir is not None else None,
            how_to_get=self.how_to_get(),
        )
        for row in rows[:1]:
            missing = [key for key in HUB_SCHEMA if key not in row]
            if missing:
                raise ValueError(f"LongBench-v2 records lack the hub fields {missing}")
        return rows if self.n is None else rows[: self.n]

    def build(self, tokenizer: Any, record: dict[str, Any]) -> Example:
        """One question -> an example under the official protocol."""
        prompt = fill(TEMPLATE_0SHOT_COT if self.cot else TEMPLATE_0SHOT, record)
        prompt, truncated = truncate_middle(tokenizer, prompt, self.max_length, tail_rounds_up=True)
        ids = encode(tokenizer, prompt, chat=self.chat_template)
        return Example(
            example_id=f"{SUBTASK}/{record['_id']}",
            subtask=SUBTASK,
            input_ids=ids,
            answers=[record["answer"]],
            max_new_tokens=MAX_NEW_TOKENS_COT if self.cot else MAX_NEW_TOKENS,
            meta={
                "difficulty": record["difficulty"],
                "length": record["length"],
                "domain": record["domain"],
                "sub_domain": record["sub_domain"],
                "prompt_tokens": len(ids),
                "truncated": truncated,
            },
        )

    def examples(self, tokenizer: Any) -> list[Example]:
        return [self.build(tokenizer, record) for record in self.records()]

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        # pred.py strips the response before extracting the letter.
        return {"acc": float(extract_answer(prediction.strip()) == example.answers[0])}
