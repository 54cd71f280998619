"""The RULER task family, as the harness sees it.

Each requested (subtask, length) pair gets RULER's haystack search once, then ``n``
examples; example ``i`` depends only on (seed, subtask, length, i), so widening ``n`` or
adding lengths or subtasks leaves existing examples unchanged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tasks.base import Example, Task
from tasks.ruler.niah import (
    SUBTASKS,
    TOKENS_TO_GENERATE,
    Encoder,
    essay_words,
    fit_example,
    search_haystack,
)
from tasks.ruler.scoring import string_match_all


def make_encoder(tokenizer: Any, chat_template: bool) -> Encoder:
    """Prompt -> prefill ids: the prompt is the user turn, the answer prefix opens the reply.

    RULER puts the answer prefix right after the model's assistant header; models without a
    chat template (and ``chat_template=False``) get the raw prompt, as RULER's ``base``.
    """
    if chat_template and getattr(tokenizer, "chat_template", None):

        def encode(prompt: str, answer_prefix: str) -> list[int]:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            # The rendered template already carries any BOS token it wants.
            return list(tokenizer(text + answer_prefix, add_special_tokens=False, verbose=False)["input_ids"])

    else:

        def encode(prompt: str, answer_prefix: str) -> list[int]:
            return list(tokenizer(prompt + answer_prefix, verbose=False)["input_ids"])

    return encode


@dataclass
class RulerTask(Task):
    """RULER synthetic tasks (niah subtasks so far).

    Parameters:
        tasks: subtask names, e.g. ``niah_single_1``; see ``tasks.ruler.niah.SUBTASKS``.
        lengths: target sequence lengths in tokens (prompt plus tokens to generate).
        n: examples per (subtask, length).
        seed: base seed of the synthesis.
        chat_template: wrap the prompt in the tokenizer's chat template when it has one.
        haystack_file: plain-text corpus for the subtasks RULER runs on its essay haystack.
    """

    name: ClassVar[str] = "ruler"

    tasks: list[str] = field(default_factory=lambda: ["niah_single_1"])
    lengths: list[int] = field(default_factory=lambda: [1024])
    n: int = 10
    seed: int = 0
    chat_template: bool = True
    haystack_file: str | None = None

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig objects; plain lists keep the task picklable and simple.
        self.tasks = list(self.tasks)
        self.lengths = list(self.lengths)
        if not self.tasks:
            raise ValueError(f"task.tasks is empty; choose from {sorted(SUBTASKS)}")
        for name in self.tasks:
            if name not in SUBTASKS:
                raise ValueError(f"unknown RULER subtask {name!r}; choose from {sorted(SUBTASKS)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"task.tasks lists a subtask twice: {self.tasks}")
        if not self.lengths:
            raise ValueError("task.lengths is empty")
        for length in self.lengths:
            if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                raise ValueError(f"task.lengths must be positive integers, got {length!r}")
            if length <= TOKENS_TO_GENERATE:
                raise ValueError(
                    f"task.lengths: {length} leaves no room for a prompt next to RULER's "
                    f"{TOKENS_TO_GENERATE} generated tokens"
                )
        if len(set(self.lengths)) != len(self.lengths):
            raise ValueError(f"task.lengths lists a length twice: {self.lengths}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"task.n must be an integer >= 1, got {self.n!r}")
        if self.haystack_file is None:
            for name in self.tasks:
                if SUBTASKS[name].haystack == "essay":
                    raise ValueError(
                        f"RULER subtask {name!r} uses the essay haystack, which needs a plain-text "
                        f"corpus: pass task.haystack_file=path/to/text.txt"
                    )

    def identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "chat_template": self.chat_template, "haystack_file": self.haystack_file}

    def _essay(self) -> list[str] | None:
        if not any(SUBTASKS[name].haystack == "essay" for name in self.tasks):
            return None
        path = Path(self.haystack_file or "")
        if not path.is_file():
            raise FileNotFoundError(f"task.haystack_file={self.haystack_file!r} is not a file")
        words = essay_words(path.read_text(encoding="utf-8"))
        if words == [""]:
            raise ValueError(f"task.haystack_file={self.haystack_file!r} is empty")
        return words

    def examples(self, tokenizer: Any) -> list[Example]:
        encode = make_encoder(tokenizer, self.chat_template)
        words = self._essay()
        out: list[Example] = []
        for subtask in self.tasks:
            config = SUBTASKS[subtask]
            corpus = words if config.haystack == "essay" else None
            for length in self.lengths:
                key = f"{self.seed}/{subtask}/{length}"
                size = search_haystack(config, length, encode, random.Random(f"{key}/search"), corpus)
                for index in range(self.n):
                    sample, ids = fit_example(config, length, size, encode, f"{key}/{index}", corpus)
                    out.append(
                        Example(
                            example_id=f"{subtask}/{length}/{index:04d}",
                            subtask=subtask,
                            input_ids=ids,
                            answers=sample.answers,
                            max_new_tokens=TOKENS_TO_GENERATE,
                            meta={
                                "length": length,
                                "depths": [round(d, 2) for d in sample.depths],
                                "prompt_tokens": len(ids),
                                "num_haystack": sample.num_haystack,
                            },
                        )
                    )
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        return {"string_match_all": string_match_all(prediction, example.answers)}
