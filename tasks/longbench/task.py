"""LongBench (and LongBench-E) as the harness sees it, following the official ``LongBench/pred.py`` and ``eval.py``.

Per example: the dataset's official prompt, middle truncation of its tokenisation to
``max_length`` tokens, then the chat template except on the six datasets the official script
leaves raw; the dataset's official new-token budget; samsum stops at a newline; the official
metric, x100, under the single key ``score`` so the harness averages datasets like the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tasks.base import Example, Task, as_list, require_int, require_once, require_str
from tasks.digest import content_digest
from tasks.hub import load_rows
from tasks.longbench import metrics
from tasks.longbench.prompting import encode, truncate_middle
from tasks.longbench.protocol import (
    DATASETS,
    DATASETS_E,
    MAX_NEW_TOKENS,
    METRIC,
    NO_CHAT_TEMPLATE,
    PROMPTS,
    base_name,
    length_bucket,
)

HUB_SCHEMA = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")
NOT_NULL = ("answers", "length")


def build_prompt(dataset: str, record: dict[str, Any]) -> str:
    """The official prompt of ``dataset`` filled with one record (``{context}`` and ``{input}``)."""
    return PROMPTS[base_name(dataset)].format(context=record["context"], input=record["input"])


@dataclass
class LongBenchTask(Task):
    """LongBench's 21 datasets and LongBench-E's 13 ``_e`` datasets.

    Parameters:
        datasets: dataset names, e.g. ``narrativeqa`` or ``qasper_e``.
        n: first ``n`` records of each dataset (``None``: all).
        max_length: prompt tokens kept by middle truncation; the official value is the model's
            context minus room to generate (``config/model2maxlen.json``: 3500 for a 4k model,
            7500 for 8k, 31500 for 32k).
        chat_template: wrap the prompt in the tokenizer's chat template (where the dataset gets one).
        hub_id: hub dataset holding a parquet copy, one data directory per dataset.
        revision: the hub revision to read (default: a pinned commit of the parquet conversion).
        data_dir: local folder with ``<dataset>.jsonl`` files in the hub schema (the official
            ``data.zip``); used instead of the hub when set.
    """

    name: ClassVar[str] = "longbench"

    datasets: list[str] = field(default_factory=lambda: list(DATASETS))
    n: int | None = None
    max_length: int = 4096
    chat_template: bool = True
    hub_id: str = "zai-org/LongBench"
    revision: str | None = "36914d6211386125c6fc4ce7db4a6a777fadd34c"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig objects; a plain list keeps the task simple and picklable.
        self.datasets = as_list("datasets", self.datasets)
        choices = f"choose from {', '.join(DATASETS + DATASETS_E)}"
        if not self.datasets:
            raise ValueError(f"task.datasets={self.datasets!r} is empty — {choices}")
        for dataset in self.datasets:
            if dataset not in DATASETS and dataset not in DATASETS_E:
                raise ValueError(f"task.datasets={self.datasets!r} names an unknown dataset {dataset!r} — {choices}")
        require_once("datasets", self.datasets)
        require_int("n", self.n, optional=True, example=50)
        require_int("max_length", self.max_length, minimum=2, example=3500)
        for option in ("hub_id", "revision", "data_dir"):
            require_str(option, getattr(self, option), optional=option != "hub_id")

    def identity(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "chat_template": self.chat_template,
            "hub_id": self.hub_id,
            "revision": self.revision,
            "data_dir": content_digest(self.data_dir, "task.data_dir"),
        }

    def how_to_get(self, dataset: str) -> str:
        """What to do when ``dataset``'s records cannot be loaded."""
        return (
            f"LongBench data: either go online once so `datasets` caches the hub copy "
            f"(task.hub_id={self.hub_id} task.revision={self.revision}, data directory {dataset!r}), "
            f"or download data.zip from the hub dataset THUDM/LongBench (now zai-org/LongBench), unzip it "
            f"and pass task.data_dir=<unzipped>/data, the folder holding {dataset}.jsonl "
            f"(one file per dataset: narrativeqa.jsonl, ..., qasper_e.jsonl, ...)."
        )

    def records(self, dataset: str) -> list[dict[str, Any]]:
        """The dataset's records in the hub schema, first ``n`` only."""
        local = Path(self.data_dir) / f"{dataset}.jsonl" if self.data_dir is not None else None
        rows = load_rows(
            self.hub_id,
            revision=self.revision,
            split="test",
            data_dir=dataset,
            local_file=local,
            how_to_get=self.how_to_get(dataset),
        )
        for number, row in enumerate(rows, start=1):
            # build() needs a list of answers and an int length; other fields may be null (all_classes mostly is).
            missing = [key for key in HUB_SCHEMA if key not in row or (key in NOT_NULL and row[key] is None)]
            if missing:
                where = local if local is not None else f"{self.hub_id}@{self.revision} ({dataset})"
                raise ValueError(
                    f"{where}: record {number} has no value for the hub fields {missing} — pass "
                    f"task.data_dir=<folder> whose {dataset}.jsonl has the fields {', '.join(HUB_SCHEMA)}"
                )
        return rows if self.n is None else rows[: self.n]

    def build(self, tokenizer: Any, dataset: str, record: dict[str, Any]) -> Example:
        """One record -> an example (prompt, truncation, template) under the official protocol."""
        base = base_name(dataset)
        prompt, truncated = truncate_middle(tokenizer, build_prompt(dataset, record), self.max_length)
        ids = encode(tokenizer, prompt, chat=self.chat_template and base not in NO_CHAT_TEMPLATE)
        # pred.py adds the newline token to samsum's end-of-sequence ids with min_length one past
        # the prompt: the summary may not start with the newline that would end it.
        samsum = base == "samsum"
        return Example(
            example_id=f"{dataset}/{record['_id']}",
            subtask=dataset,
            input_ids=ids,
            answers=list(record["answers"]),
            max_new_tokens=MAX_NEW_TOKENS[base],
            stop_token_ids=[tokenizer.encode("\n", add_special_tokens=False)[-1]] if samsum else [],
            min_new_tokens=1 if samsum else 0,
            meta={
                "length": length_bucket(int(record["length"])),
                "length_words": int(record["length"]),
                "language": record["language"],
                "all_classes": record["all_classes"],
                "prompt_tokens": len(ids),
                "truncated": truncated,
            },
        )

    def examples(self, tokenizer: Any) -> list[Example]:
        return [self.build(tokenizer, dataset, record) for dataset in self.datasets for record in self.records(dataset)]

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        value = metrics.score(example.subtask, prediction, example.answers, example.meta["all_classes"])
        return {"score": value, METRIC[base_name(example.subtask)]: value}
