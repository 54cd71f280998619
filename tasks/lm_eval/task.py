"""Any lm-eval task as a harness task: each document one example, prompts and metrics lm-eval's own.

lm-eval (EleutherAI's lm-evaluation-harness, pinned in the ``lm_eval`` extra) loads the task
through its ``TaskManager``, builds every document's requests (few-shot context, chat
template, ``gen_prefix``) and scores them with the task's filters and ``process_results``;
``LmEvalRequests`` tokenises the requests as lm-eval's ``hf`` model does. What the harness
adds is the eviction method, one record per document (``<task>/<doc id>``) and resumption.

Readings where lm-eval leaves a choice to its caller:
- seeds: every listed task is loaded under lm-eval's default seeds (python 0, numpy and torch
  1234, few-shot 1234) as if it were the only task of the command. lm-eval's command line
  carries the random state from one task to the next, so there a synthetic task's documents
  (RULER) or a shuffled option order (GPQA) depend on the tasks listed before it; here a
  document does not, which is what lets widening ``task.tasks`` resume.
- metrics: a record keeps, per filter, ``<metric>,<filter>`` (lm-eval's result names) with the
  task's aggregation of that one document (a mean: the document's value; ``perplexity``:
  exp(-log-likelihood) of the document, where lm-eval's per-document value is the
  log-likelihood), and leaves out a value the aggregation itself discards (lm-eval's RULER
  gives every configured length, -1 for all but the document's own). The run summary averages
  documents, where a corpus-level aggregation (perplexity, BLEU, group weights) would pool them.
- length: prompts are not truncated unless ``max_length`` is set (lm-eval's hf model truncates
  to the model's positions); the harness refuses a prompt beyond them before any weights load.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import lm_eval
import numpy as np
import torch
from lm_eval.api.group import Group
from lm_eval.api.instance import Instance
from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
from lm_eval.tasks import TaskManager
from lm_eval.tasks._factory import TaskFactory

from tasks.base import Call, CallResult, Example, Scored, Task, TaskProtocol, as_dict, as_list, require_int, require_str
from tasks.digest import content_digests
from tasks.hub import offline_unless_reachable, unavailable_reason
from tasks.lm_eval.requests import LmEvalRequests, ranked_documents

# Local data files by extension, read through the ``datasets`` builder of that format.
BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
SPLITS = ("training_split", "validation_split", "test_split", "fewshot_split")


@cache
def task_manager(include_path: str | None) -> TaskManager:
    """lm-eval's index of task configs (built once per process: it reads every YAML lm-eval ships)."""
    return TaskManager(include_path=include_path)


@dataclass
class _Document:
    """What scoring one document needs: its lm-eval task, the document, its requests and their calls."""

    task: Any
    doc: dict[str, Any]
    requests: list[Instance]
    plan: list[tuple[Instance, int]]


@dataclass
class LmEvalTask(Task):
    """lm-eval tasks, one record per document.

    Parameters:
        tasks: lm-eval task, group or tag names (``lm-eval ls tasks``); a group's tasks are
            loaded together, as lm-eval's command line loads them.
        n: the first ``n`` documents of each task (lm-eval's ``--limit``); None: all.
        num_fewshot, apply_chat_template, fewshot_as_multiturn, system_instruction: lm-eval's
            options of the same names (``fewshot_as_multiturn`` None follows ``apply_chat_template``).
        gen_kwargs: generation arguments overriding the tasks' own (lm-eval's ``--gen_kwargs``).
        metadata: lm-eval's ``--metadata`` (RULER: ``max_seq_lengths``); ``tokenizer`` defaults
            to the evaluated model's.
        max_length: lm-eval's ``max_length`` model argument (see ``LmEvalRequests``).
        data_files: per lm-eval task, a local csv/json/jsonl/parquet file in its hub dataset's
            schema, read for every split the task names (or a ``{split: file}`` mapping).
        revisions: per lm-eval task, the hub dataset commit to read; a task listed with null
            must be pinned here or read from ``data_files`` before it runs.
        include_path: a folder of further lm-eval task YAMLs (lm-eval's ``--include_path``).
    """

    name: ClassVar[str] = "lm_eval"

    tasks: list[str] = field(default_factory=lambda: ["niah_single_1"])
    n: int | None = 10
    num_fewshot: int | None = None
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool | None = None
    system_instruction: str | None = None
    gen_kwargs: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    max_length: int | None = None
    data_files: dict[str, Any] | None = None
    revisions: dict[str, str | None] | None = None
    include_path: str | None = None

    def __post_init__(self) -> None:
        self.tasks = [str(name) for name in as_list("tasks", self.tasks)]
        if not self.tasks:
            raise ValueError("task.tasks=[] is empty — name lm-eval tasks, e.g. task.tasks=[niah_single_1]")
        require_int("n", self.n, optional=True, example=10)
        require_int("num_fewshot", self.num_fewshot, minimum=0, optional=True)
        require_int("max_length", self.max_length, optional=True, example=8192)
        for option in ("apply_chat_template", "fewshot_as_multiturn"):
            value = getattr(self, option)
            if not isinstance(value, bool) and not (option == "fewshot_as_multiturn" and value is None):
                raise ValueError(f"task.{option}={value!r} is not true or false — use task.{option}=true")
        if self.fewshot_as_multiturn is None:
            self.fewshot_as_multiturn = self.apply_chat_template
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise ValueError(
                "task.fewshot_as_multiturn=true needs the chat template — set task.apply_chat_template=true too"
            )
        require_str("system_instruction", self.system_instruction)
        require_str("include_path", self.include_path)
        # Hydra hands over DictConfig/ListConfig objects; lm-eval checks for plain lists and dicts.
        self.gen_kwargs = None if self.gen_kwargs is None else _container(as_dict("gen_kwargs", self.gen_kwargs))
        self.metadata = _container(as_dict("metadata", self.metadata or {}))
        # A task listed with a null file reads its hub dataset (a preset names the key to override).
        files = _container(as_dict("data_files", self.data_files or {}))
        self.data_files = {key: value for key, value in files.items() if value is not None}
        self.revisions = _container(as_dict("revisions", self.revisions or {}))
        for option in ("data_files", "revisions"):
            for key in getattr(self, option):
                if key not in self.tasks:
                    raise ValueError(
                        f"task.{option} has the key {key!r}, not one of task.tasks={self.tasks}"
                        " — key it by a listed task"
                    )
        for key, value in self.revisions.items():
            require_str(f"revisions.{key}", value)
        if self.include_path is not None and not Path(self.include_path).is_dir():
            raise FileNotFoundError(
                f"task.include_path={self.include_path!r} is not a folder — point it at a folder of lm-eval task YAMLs"
            )
        self._requests: LmEvalRequests | None = None
        self._documents: dict[str, _Document] = {}

    @property
    def protocol(self) -> TaskProtocol:
        return TaskProtocol.CALLS

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {
            "lm_eval": lm_eval.__version__,
            "num_fewshot": self.num_fewshot,
            "apply_chat_template": self.apply_chat_template,
            "fewshot_as_multiturn": self.fewshot_as_multiturn,
            "system_instruction": self.system_instruction,
            "gen_kwargs": self.gen_kwargs,
            "metadata": self.metadata,
            "max_length": self.max_length,
            "data_files": content_digests(self.data_files, "task.data_files"),
            "revisions": self.revisions,
        }
        if self.include_path is not None:
            identity["include_path"] = _folder_digest(Path(self.include_path))
        return identity

    def examples(self, tokenizer: Any) -> list[Example]:
        self._requests = LmEvalRequests(tokenizer, self.max_length)
        self._documents = {}
        out: list[Example] = []
        for name in self.tasks:
            for task_name, task in self._load(name, tokenizer).items():
                out += self._task_examples(task_name, task)
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        raise NotImplementedError("lm-eval documents are scored through score_calls")

    def score_calls(self, results: list[CallResult], example: Example) -> Scored:
        document = self._documents[example.example_id]
        for request in document.requests:
            request.resps, request.filtered_resps = [], {}
        offset = 0
        for request, count in document.plan:
            request.resps.append(self._requests.response(request, results[offset : offset + count]))
            offset += count
        for ensemble in document.task._filters:
            ensemble.apply(document.requests)
        metrics: dict[str, float] = {}
        aggregations = document.task.aggregation()
        for key in document.requests[0].filtered_resps:
            values = document.task.process_results(document.doc, [r.filtered_resps[key] for r in document.requests])
            for metric, item in values.items():
                value = _document_value(aggregations.get(metric), item)
                if value is not None:
                    metrics[f"{metric},{key}"] = value
        first = next(iter(document.requests[0].filtered_resps))
        return Scored(
            prediction=self._prediction(document, first),
            metrics=metrics,
            meta={"responses": [_plain(request.resps) for request in document.requests]},
        )

    def _load(self, name: str, tokenizer: Any) -> dict[str, Any]:
        """The lm-eval tasks behind ``name``, loaded and set up as lm-eval's ``simple_evaluate`` does."""
        manager = task_manager(self.include_path)
        entry = manager.task_index.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"task.tasks names {name!r}, not an lm-eval task, group or tag{hint} — list them with"
                " `lm-eval ls tasks`, e.g. task.tasks=[niah_single_1]"
            )
        factory = TaskFactory(meta={"tokenizer": tokenizer.name_or_path, **self.metadata})
        random.seed(DEFAULT_RANDOM_SEED)
        np.random.seed(DEFAULT_OTHER_SEED)
        torch.manual_seed(DEFAULT_OTHER_SEED)
        overrides = self._overrides(name, entry)
        offline = offline_unless_reachable()
        try:
            built = factory.build(entry, overrides=overrides, registry=manager.task_index)
        except OSError as error:
            # datasets' "not available": no network, not in the cache, no such repository or revision.
            raise FileNotFoundError(_unavailable(name, entry, overrides, error, offline)) from error
        leaves = built.get_all_tasks() if isinstance(built, Group) else built if isinstance(built, list) else [built]
        loaded = {task.task_name: task for task in leaves}
        for task_name, task in loaded.items():
            self._check(task_name, task)
            if task.get_config("output_type") == "generate_until" and self.gen_kwargs is not None:
                task.set_config(key="generation_kwargs", value=dict(self.gen_kwargs), update=True)
            if self.num_fewshot is not None and task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=self.num_fewshot)
            elif task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
        return loaded

    def _overrides(self, name: str, entry: Any) -> dict[str, Any] | None:
        """Config fields replacing the task's own: its local data file, or its pinned dataset revision."""
        if name not in self.data_files and name not in self.revisions:
            return None
        config = entry.cfg or {}
        if name in self.data_files:
            files = self.data_files[name]
            if not isinstance(files, dict):
                files = {config[key]: files for key in SPLITS if config.get(key)}
            for file in files.values():
                if not Path(str(file)).is_file():
                    raise FileNotFoundError(
                        f"task.data_files.{name}={file!r} does not exist — point it at a local copy in the hub schema"
                    )
            suffix = Path(str(next(iter(files.values())))).suffix
            if suffix not in BUILDERS:
                raise ValueError(
                    f"task.data_files.{name} is a {suffix or 'suffix-less'} file — use one of {', '.join(BUILDERS)}"
                )
            return {"dataset_path": BUILDERS[suffix], "dataset_name": None, "dataset_kwargs": {"data_files": files}}
        revision = self.revisions[name]
        if revision is None:
            raise ValueError(
                f"task.revisions.{name} is not pinned — set it to the commit of {config.get('dataset_path')!r} to"
                " read (huggingface_hub.HfApi().dataset_info(...).sha), or read a local copy with"
                f" task.data_files.{name}=<file>"
            )
        return {"dataset_kwargs": {**(config.get("dataset_kwargs") or {}), "revision": revision}}

    def _check(self, task_name: str, task: Any) -> None:
        if getattr(task, "UNSAFE_CODE", False):
            raise ValueError(
                f"lm-eval task {task_name!r} runs model-written code, which lm-eval does unsandboxed"
                " — evictbench does not run such tasks: choose another task"
            )
        if getattr(task, "MULTIMODAL", False):
            raise ValueError(
                f"lm-eval task {task_name!r} needs images or audio — the engine serves text: choose a text task"
            )

    def _task_examples(self, task_name: str, task: Any) -> list[Example]:
        requests = self._requests
        task.build_all_requests(
            limit=self.n,
            system_instruction=self.system_instruction,
            apply_chat_template=self.apply_chat_template,
            fewshot_as_multiturn=self.fewshot_as_multiturn,
            chat_template=requests.apply_chat_template if self.apply_chat_template else None,
            tokenizer_name=requests.tokenizer_name if self.apply_chat_template else "",
        )
        ranked = ranked_documents(task.instances)
        by_doc: dict[int, list[Instance]] = {}
        for request in task.instances:
            by_doc.setdefault(request.doc_id, []).append(request)
        out = []
        for doc_id, doc_requests in by_doc.items():
            doc_requests.sort(key=lambda request: request.idx)
            calls: list[Call] = []
            plan: list[tuple[Instance, int]] = []
            for request in doc_requests:
                for repeat in range(request.repeats):
                    made = requests.calls(request, repeat, ranked=(task_name, doc_id) in ranked)
                    calls += made
                    plan.append((request, len(made)))
            doc = doc_requests[0].doc
            longest = max(calls, key=lambda call: len(call.input_ids) + call.max_new_tokens)
            example = Example(
                example_id=f"{task_name}/{doc_id:05d}",
                subtask=task_name,
                input_ids=longest.input_ids,
                answers=_answers(task, doc),
                max_new_tokens=longest.max_new_tokens,
                meta={"doc_id": doc_id, "output_type": task.OUTPUT_TYPE, "prompt_tokens": len(longest.input_ids)},
                calls=calls,
            )
            self._documents[example.example_id] = _Document(task, doc, doc_requests, plan)
            out.append(example)
        return out

    def _prediction(self, document: _Document, key: str) -> str:
        """The generated answer; for multiple choice the option with the highest log-likelihood."""
        filtered = [request.filtered_resps[key] for request in document.requests]
        if document.task.OUTPUT_TYPE == "generate_until":
            return str(filtered[0])
        if document.task.OUTPUT_TYPE == "multiple_choice":
            choices = document.task.doc_to_choice(document.doc)
            best = int(np.argmax([response[0] for response in filtered]))
            return str(choices[best]) if best < len(choices) else str(best)
        return ""


def _unavailable(name: str, entry: Any, overrides: dict[str, Any] | None, error: OSError, offline: bool) -> str:
    """Why lm-eval task ``name`` could not load its dataset, and how to give it one."""
    config = entry.cfg or {}
    revision = ((overrides or {}).get("dataset_kwargs") or {}).get("revision")
    where = f"{config.get('dataset_path', name)}@{revision}" if revision else str(config.get("dataset_path", name))
    reason = unavailable_reason(error, offline)
    return (
        f"lm-eval task {name!r} could not load {where} ({reason}) — run it once with network access to fill"
        f" the datasets cache, or read a local copy with task.data_files.{name}=<file in the hub schema>"
    )


def _answers(task: Any, doc: dict[str, Any]) -> list[str]:
    target = task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice" and isinstance(target, int):
        choices = task.doc_to_choice(doc)
        target = choices[target] if 0 <= target < len(choices) else target
    return [str(item) for item in target] if isinstance(target, list) else [str(target)]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool | np.bool_)


def _document_value(aggregate: Any, item: Any) -> float | None:
    """One document's value of a metric: the task's aggregation of that document alone, or None when it discards it."""
    if isinstance(item, bool | np.bool_):
        item = float(item)
    value = item if aggregate is None else aggregate([item])
    if not _is_number(value):
        return None
    # Only a number can be a sentinel: a pair for a corpus metric (F1) may score what no documents score.
    if _is_number(item) and aggregate is not None and float(value) == _empty_aggregate(aggregate):
        return None
    return float(value)


@cache
def _empty_aggregate(aggregate: Any) -> float | None:
    """What ``aggregate`` gives for no documents, when it gives a number (lm-eval's RULER: -1)."""
    try:
        value = aggregate([])
    # An aggregation that cannot take zero documents (a mean) discards none: whatever it raises.
    except Exception:
        return None
    return float(value) if _is_number(value) else None


def _container(value: Any) -> Any:
    """``value`` with every nested mapping a dict and every nested sequence a list."""
    if isinstance(value, Mapping):
        return {key: _container(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_container(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    """``value`` as JSON: tuples as lists, numpy scalars as Python numbers."""
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _folder_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".yml", ".py"):
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()
