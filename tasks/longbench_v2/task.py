"""LongBench-v2 as the harness sees it, following the official ``pred.py`` and ``result.py``.

Per question: the official 0-shot (or CoT) template, middle truncation of its tokenisation to
``max_length`` tokens, the chat template (the official script always sends a chat message),
and ``acc`` = 1 when the official answer regex finds the gold letter, else 0. Unlike pred.py,
which skips a question whose API call returned an empty string, an empty or unparseable output
is recorded and scores 0: dropping it would inflate the accuracy of a degraded cache.

Every record has the subtask ``longbench_v2``, so the harness's overall mean is the official
overall accuracy; ``meta`` carries ``difficulty`` (easy/hard), ``length`` (short/medium/long),
``domain`` and ``sub_domain`` for result.py's breakdowns.

``cot=True`` follows pred.py's two calls: the reasoning pass (0shot_cot.txt, 1024 new tokens)
under the method being evaluated, then the document-free answer pass (0shot_cot_ans.txt: the
question, the stripped reasoning, "what is the single, most likely answer choice?", 128 new
tokens, truncated like any prompt), whose output the regex reads. The answer pass runs with
the full cache: it holds no document, so a score difference between methods comes from how
they read the document. The record's ``prediction`` is the answer pass's output and
``meta.first_prediction`` the reasoning. An empty reasoning gets no answer pass and scores 0
(pred.py drops the question).

pred.py samples every call at temperature 0.1; ``sampling.temperature=0.1`` reproduces that,
the harness's default is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tasks.base import Example, Task, TaskProtocol, require_int, require_str
from tasks.digest import content_digest
from tasks.hub import load_rows
from tasks.longbench.prompting import encode, truncate_middle
from tasks.longbench_v2.protocol import (
    MAX_NEW_TOKENS,
    MAX_NEW_TOKENS_COT,
    TEMPLATE_0SHOT,
    TEMPLATE_0SHOT_COT,
    TEMPLATE_0SHOT_COT_ANS,
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
        cot: chain-of-thought template and the answer pass (see the module docstring).
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
    # CoT answer-pass prompts by example id, all but the reasoning filled in by ``build``.
    _answer_templates: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        require_int("n", self.n, optional=True, example=50)
        require_int("max_length", self.max_length, minimum=2, example=120000)
        for option in ("hub_id", "revision", "data_dir"):
            require_str(option, getattr(self, option), optional=option != "hub_id")

    @property
    def protocol(self) -> TaskProtocol:
        return TaskProtocol.GENERATE_THEN_ANSWER if self.cot else TaskProtocol.GENERATE

    def identity(self) -> dict[str, Any]:
        return {
            "cot": self.cot,
            "max_length": self.max_length,
            "chat_template": self.chat_template,
            "hub_id": self.hub_id,
            "revision": self.revision,
            "data_dir": content_digest(self.data_dir, "task.data_dir"),
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
        local = Path(self.data_dir) / "data.json" if self.data_dir is not None else None
        rows = load_rows(
            self.hub_id, revision=self.revision, split="train", local_file=local, how_to_get=self.how_to_get()
        )
        for number, row in enumerate(rows, start=1):
            missing = [key for key in HUB_SCHEMA if key not in row]
            if missing:
                where = local if local is not None else f"{self.hub_id}@{self.revision}"
                raise ValueError(
                    f"{where}: record {number} lacks the hub fields {missing} — pass task.data_dir=<folder> whose "
                    f"data.json has the fields {', '.join(HUB_SCHEMA)}"
                )
        return rows if self.n is None else rows[: self.n]

    def _encode(self, tokenizer: Any, prompt: str) -> tuple[list[int], bool]:
        prompt, truncated = truncate_middle(tokenizer, prompt, self.max_length, tail_rounds_up=True)
        return encode(tokenizer, prompt, chat=self.chat_template), truncated

    def build(self, tokenizer: Any, record: dict[str, Any]) -> Example:
        """One question -> an example under the official protocol."""
        example_id = f"{SUBTASK}/{record['_id']}"
        if self.cot:
            self._answer_templates[example_id] = fill(TEMPLATE_0SHOT_COT_ANS, record)
        ids, truncated = self._encode(tokenizer, fill(TEMPLATE_0SHOT_COT if self.cot else TEMPLATE_0SHOT, record))
        return Example(
            example_id=example_id,
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

    def follow_up(self, tokenizer: Any, example: Example, prediction: str) -> Example | None:
        """The CoT answer pass over the stripped reasoning; none for an empty reasoning (it scores 0)."""
        reasoning = prediction.strip()
        if not reasoning:
            return None
        ids, _ = self._encode(tokenizer, self._answer_templates[example.example_id].replace("$COT$", reasoning))
        return Example(
            example_id=f"{example.example_id}/answer",
            subtask=SUBTASK,
            input_ids=ids,
            answers=example.answers,
            max_new_tokens=MAX_NEW_TOKENS,
        )

    def examples(self, tokenizer: Any) -> list[Example]:
        return [self.build(tokenizer, record) for record in self.records()]

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        # pred.py strips the response before extracting the letter.
        return {"acc": float(extract_answer(prediction.strip()) == example.answers[0])}
