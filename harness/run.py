"""``python -m harness.run model=... method=... task=... rho=... seed=...``

Composes the config (``conf/``), checks everything a user can get wrong before any weights
load and before anything is written, then runs every example not yet recorded in the run's
folder and appends one record per example. The folder name is derived from the config
(``harness.record.schema``), so rerunning the same command resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from transformers import PretrainedConfig

from harness.config import CONF_DIR, SCALES
from harness.decode import kv_cache
from harness.decode.engine import Engine, Request, check_sequence
from harness.decode.retention import FILENAME as DIAGNOSTICS_FILE
from harness.decode.retention import RetentionRecorder
from harness.decode.sampling import Sampling
from harness.errors import UserError, cli, show_tracebacks, user_errors
from harness.models import ModelSpec, check_buildable, check_device, load_config, load_model, load_tokenizer
from harness.models import writable_folder as _writable
from harness.options import check_appended, check_fields, check_types
from harness.protocols.dialog_world import MethodPolicy
from harness.record import provenance
from harness.record.files import (
    CompanionFile,
    CorruptRecordsError,
    DuplicateRecordError,
    RecordFile,
    RunBusyError,
    RunLock,
    append_lines,
    write_atomic,
)
from harness.record.identity import MIGRATE, Identity, identify, older_folders, record_version
from harness.record.schema import NUMERIC_FIELDS, OUTCOME_FIELDS, SCHEMA_VERSION, RunId, canonical_rho
from harness.record.summary import summarize
from harness.record.wandb_logger import open_logger
from methods.base import EvictionMethod
from methods.full import FullCache
from methods.selection import check_rho
from tasks.base import Call, CallResult, Example, Task, TaskProtocol

log = logging.getLogger(__name__)

# What a record keeps of a protocol's second, full-cache generation (``Task.follow_up``).
ANSWER_PASS_FIELDS = ("prefill_len", "new_tokens", "prefill_s", "decode_s")


def check_top_level(cfg: DictConfig) -> None:
    """Refuse a malformed top-level option: rho, scale, seed, threads, batch_size, diagnostics, sampling.

    rho becomes a float here, so ``rho=0`` and ``rho=0.0`` are one run everywhere downstream.
    """
    check_rho(cfg.rho)
    cfg.rho = canonical_rho(cfg.rho)
    if cfg.scale not in SCALES:
        raise ValueError(f"scale={cfg.scale!r} is not a scale — use scale=cluster or scale=cpu")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise ValueError(f"seed={cfg.seed!r} is not an integer — use e.g. seed=0")
    if cfg.threads is not None and (
        isinstance(cfg.threads, bool) or not isinstance(cfg.threads, int) or cfg.threads < 1
    ):
        raise ValueError(f"threads={cfg.threads!r} is not a positive integer — use e.g. threads=1, or threads=null")
    if not isinstance(cfg.diagnostics, bool):
        raise ValueError(f"diagnostics={cfg.diagnostics!r} is not true or false — use diagnostics=true")
    if isinstance(cfg.batch_size, bool) or not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise ValueError(f"batch_size={cfg.batch_size!r} is not a positive integer — use e.g. batch_size=8")
    if cfg.diagnostics and cfg.batch_size > 1:
        raise ValueError(
            f"diagnostics=true traces one sequence at a time and batch_size={cfg.batch_size} decodes several"
            " — use batch_size=1 with diagnostics"
        )
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    unknown = sorted(set(sampling) - {field.name for field in dataclasses.fields(Sampling)})
    if unknown:
        raise ValueError(f"sampling.{unknown[0]} is not a sampling option — use temperature, top_k or top_p")
    Sampling(**sampling)


def check_options(cfg: DictConfig, overrides: list[str] | None) -> None:
    """Refuse an option nothing reads: an appended top-level key, a key its node's class does not take.

    ``overrides`` are the command line's (None where they are not known).
    """
    if overrides is not None:
        base = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
        keys = [k for k in base if k != "defaults"]
        keys += [next(iter(entry)) for entry in base["defaults"] if isinstance(entry, dict)]
        check_appended(overrides, cfg, keys, [path.name for path in CONF_DIR.iterdir() if path.is_dir()])
    check_fields(cfg.task, "task")
    check_fields(cfg.method, "method")


def example_seed(seed: int, example_id: str) -> int:
    return seed * 1_000_003 + zlib.crc32(example_id.encode())


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = model.generation_config.eos_token_id
    found = set(ids) if isinstance(ids, list) else ({ids} if ids is not None else set())
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


def stop_on_strings(tokenizer: Any, strings: list[str]) -> Callable[[list[int]], bool] | None:
    if not strings:
        return None
    return lambda tokens: any(s in tokenizer.decode(tokens[-16:], skip_special_tokens=True) for s in strings)


def check_call(config: PretrainedConfig, method: EvictionMethod, call: Call, what: str) -> None:
    """Refuse a call the model or the method cannot serve (``check_sequence``), or that would not measure the method.

    A ranked continuation (a multiple-choice option) is scored from the prompt's prefill before
    the method evicts anything, its first tokens on the full cache: where the budget is below
    the prompt, the ranking would measure the full cache, not the method.
    """
    check_sequence(config, method, len(call.input_ids), call.max_new_tokens, what)
    budget = method.budget()
    if call.ranked and budget is not None and budget < len(call.input_ids):
        raise ValueError(
            f"{what}: a multiple-choice option is scored from the {len(call.input_ids)}-token prompt's prefill, before"
            f" method={method.name} evicts it to B={budget}, so the choice would measure the full cache — use a"
            f" generative variant of the task, rho=0, or method.selection.budget_tokens={len(call.input_ids)} or more"
        )


def call_request(call: Call, tokenizer: Any, stops: set[int], seed: int, example_id: str) -> Request:
    """The engine request that serves one ``Call``, under the call's own sampling when it has one."""
    return Request(
        call.input_ids,
        call.max_new_tokens,
        stop_token_ids=stops,
        stop=stop_on_strings(tokenizer, call.stop_strings),
        seed=example_seed(seed, call.seed_key or example_id),
        forced=call.forced_ids,
        sampling=None if call.sampling is None else Sampling(**call.sampling),
    )


# Summed over the calls of a ``CALLS`` example; every other record figure is its largest call's.
SUMMED_FIELDS = ("prefill_s", "decode_s", "score_s", "evict_s", "prefill_score_s", "new_tokens")


def calls_outcome(generations: list[Any]) -> dict[str, Any]:
    """The record figures of an example made of several calls: times and tokens summed, sizes the largest call's."""
    largest = max(generations, key=lambda generation: generation.kv_bytes_full)
    outcome = {name: getattr(largest, name) for name in NUMERIC_FIELDS if hasattr(largest, name)}
    for name in SUMMED_FIELDS:
        outcome[name] = sum(getattr(generation, name) for generation in generations)
    steps = sum(max(generation.new_tokens - 1, 0) for generation in generations)
    outcome["decode_tokens_per_s"] = steps / outcome["decode_s"] if outcome["decode_s"] > 0 else None
    outcome["max_cache_len"] = max(generation.max_cache_len for generation in generations)
    outcome["calls"] = len(generations)
    return outcome


def make_record(
    cfg: DictConfig, run: RunId, identity: Identity, task: Task, example: Example, outcome: dict[str, Any]
) -> dict[str, Any]:
    """One line of ``records.jsonl`` (``RECORD_FIELDS``), the rest of the outcome under ``meta``."""
    outcome = dict(outcome)
    decode_steps = max(outcome["new_tokens"] - 1, 0)
    if outcome.get("decode_tokens_per_s") is None and outcome["decode_s"] > 0:
        outcome["decode_tokens_per_s"] = decode_steps / outcome["decode_s"]
    record = {
        "schema_version": SCHEMA_VERSION,
        "run_id": str(run),
        "model": run.model,
        "method": cfg.method.name,
        "task": task.name,
        "subtask": example.subtask,
        "rho": cfg.rho,
        "seed": cfg.seed,
        "example_id": example.example_id,
        "answers": example.answers,
    }
    for name in OUTCOME_FIELDS:
        value = outcome.pop(name, 0.0 if name.endswith("_s") else None)
        record[name] = round(value, 4) if isinstance(value, float) else value
    record["identity"] = identity.fields()
    record["meta"] = {**example.meta, **outcome}
    return record


@dataclass
class Plan:
    """A run checked against the user's mistakes, before anything loads weights or writes.

    Parameters:
        cfg: the composed config.
        task, method: instantiated from it.
        spec, tokenizer, model_config: the model's spec, tokenizer and transformers config
            (None for tasks that need no model).
        run, identity: the run id and what it is computed from.
        examples: every example of the task.
        folder: the run's results folder.
    """

    cfg: DictConfig
    task: Task
    method: EvictionMethod
    spec: ModelSpec | None
    tokenizer: Any
    model_config: PretrainedConfig | None
    run: RunId
    identity: Identity
    examples: list[Example]
    folder: Path


def prepare(cfg: DictConfig, overrides: list[str] | None = None) -> Plan:
    """Everything a user can get wrong, checked in order; raises ``UserError`` with the fix.

    ``overrides`` are the command line's, when known (an appended option nothing reads is refused).
    """
    with user_errors():
        check_top_level(cfg)
        check_options(cfg, overrides)
        results = _writable(Path(cfg.results_dir), "results_dir")
        task: Task = instantiate(cfg.task)
        check_types(task, "task")
        method: EvictionMethod = instantiate(cfg.method)
        check_types(method, "method")
        spec = None if task.protocol is TaskProtocol.WORLD else ModelSpec.from_config(cfg.model)
        tokenizer = model_config = None
        if spec is not None:
            check_device(spec)
            tokenizer = load_tokenizer(spec)
            model_config = load_config(spec)
            kv_cache.check_layers(model_config, spec.name)
            check_buildable(model_config, spec)
        run, identity = identify(cfg, task, spec)
        older = older_folders(results, run)
        if older:
            raise UserError(
                f"{older[0]} holds records of this run under an older run id (schema version"
                f" {SCHEMA_VERSION} names it {run}) — re-identify it with `{MIGRATE} {results}`, or move it away"
            )
        examples = task.examples(tokenizer)
        if model_config is not None:
            for example in examples:
                what = f"example {example.example_id}"
                if task.protocol is not TaskProtocol.CALLS:
                    check_sequence(model_config, method, len(example.input_ids), example.max_new_tokens, what)
                    continue
                _check_calls(cfg, example, what)
                for index, call in enumerate(example.calls):
                    check_call(model_config, method, call, f"{what} call {index}")
    return Plan(cfg, task, method, spec, tokenizer, model_config, run, identity, examples, results / str(run))


def _check_calls(cfg: DictConfig, example: Example, what: str) -> None:
    """Refuse run options that an example made of calls cannot honour."""
    if (
        any(call.sampling is not None for call in example.calls)
        and Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True)) != Sampling()
    ):
        raise ValueError(
            f"sampling={OmegaConf.to_container(cfg.sampling)}: {what} samples as its task says (lm-eval's generation"
            " arguments) — set task.gen_kwargs='{do_sample: true, temperature: 0.6}' instead of sampling.*"
        )
    if cfg.diagnostics and len(example.calls) > 1:
        raise ValueError(
            f"diagnostics=true traces one sequence per record and {what} makes {len(example.calls)} calls"
            " — run diagnostics on a task with one generation per document"
        )


def model_runner(
    plan: Plan, diagnostics: CompanionFile | None
) -> tuple[Callable[[list[Example]], Iterator[list[tuple[Example, dict]]]], Any]:
    """Load the model; return the runner of a list of examples (it yields each example's outcome) and the model.

    With ``batch_size`` > 1 the examples' sequences decode together (``Engine.generate_batch``) and
    outcomes come as examples finish, not in order. With ``diagnostics`` every example's per-step
    retained sets and scores go to that file just before its record (decode then computes attention
    weights at every step, so its timings are not comparable with a plain run: such runs have their
    own run id).
    """
    cfg, task, tokenizer = plan.cfg, plan.task, plan.tokenizer
    model = load_model(plan.spec)
    sampling = Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True))
    engine = Engine(model, plan.method, sampling, tokenizer=tokenizer)
    # Attached before the first sequence: the recorder wraps the method's scorer.
    recorder = RetentionRecorder.attach(engine) if diagnostics is not None else None
    stops = stop_token_ids(model, tokenizer)
    answers = task.protocol is TaskProtocol.GENERATE_THEN_ANSWER
    answer_engine = Engine(model, FullCache(), sampling)

    def request(example: Example) -> Request:
        return Request(
            example.input_ids,
            example.max_new_tokens,
            stop_token_ids=stops | set(example.stop_token_ids),
            stop=stop_on_strings(tokenizer, task.stop_strings(example)),
            seed=example_seed(cfg.seed, example.example_id),
            forced=example.forced_ids if task.protocol is TaskProtocol.TEACHER_FORCED else None,
            min_new_tokens=example.min_new_tokens,
        )

    def requests(example: Example) -> list[Request]:
        if task.protocol is TaskProtocol.CALLS:
            return [call_request(call, tokenizer, stops, cfg.seed, example.example_id) for call in example.calls]
        return [request(example)]

    def finish_calls(example: Example, generations: list[Any]) -> dict[str, Any]:
        results = [
            CallResult(
                text=tokenizer.decode(generation.tokens, skip_special_tokens=True) if call.forced_ids is None else "",
                logprobs=generation.target_logprobs,
                greedy=generation.target_greedy,
            )
            for call, generation in zip(example.calls, generations, strict=True)
        ]
        scored = task.score_calls(results, example)
        return {"prediction": scored.prediction, "metrics": scored.metrics, **calls_outcome(generations), **scored.meta}

    def finish(example: Example, generations: list[Any]) -> dict[str, Any]:
        if recorder is not None:
            diagnostics.append(recorder.finish(example.example_id, example.subtask))
        if task.protocol is TaskProtocol.CALLS:
            return finish_calls(example, generations)
        generation = generations[0]
        prediction = tokenizer.decode(generation.tokens, skip_special_tokens=True)
        outcome = {name: getattr(generation, name) for name in NUMERIC_FIELDS if hasattr(generation, name)}
        outcome["max_cache_len"] = generation.max_cache_len
        outcome |= generation.method_report
        if "pattern_positions" in generation.method_report:
            # A retention pattern names sequence positions; the record keeps their tokens for the figure.
            sequence = example.input_ids + generation.tokens
            outcome["pattern_tokens"] = [tokenizer.decode([sequence[p]]) for p in outcome["pattern_positions"]]
        if task.protocol is TaskProtocol.TEACHER_FORCED:
            metrics = task.score_logprobs(generation.target_logprobs, example)
        else:
            follow_up = task.follow_up(tokenizer, example, prediction) if answers else None
            if follow_up is not None:
                answer = answer_engine.generate(request(follow_up))
                outcome["first_prediction"] = prediction
                outcome["answer_pass"] = {name: getattr(answer, name) for name in ANSWER_PASS_FIELDS}
                prediction, example = tokenizer.decode(answer.tokens, skip_special_tokens=True), follow_up
            metrics = task.score(prediction, example)
        return {"prediction": prediction, "metrics": metrics, **outcome}

    def run_all(todo: list[Example]) -> Iterator[list[tuple[Example, dict]]]:
        for number, generations in engine.generate_groups([requests(e) for e in todo], cfg.batch_size):
            example = todo[number]
            yield [(example, {**finish(example, generations), "batch_size": cfg.batch_size})]

    return run_all, model


def _check_recorded(records: RecordFile, identity: Identity, batch_size: int) -> None:
    """Refuse to add records to a folder whose records came from another identity.

    An older record (schema version below today's) made under the same identity and batch size
    is read as it is; any other difference means the folder belongs to another run under
    today's rules (``python -m harness.record.migrate`` moves it there), or that a preset was edited.
    """
    for record in records.records():
        recorded = record.get("identity")
        older = record_version(record) < SCHEMA_VERSION
        decoded_at = (record.get("meta") or {}).get("batch_size", 1)
        if recorded is None or (recorded == identity.fields() and (not older or decoded_at == batch_size)):
            continue
        if older:
            raise UserError(
                f"{records.path} holds records of schema version {record_version(record)}, which today's rules"
                f" (version {SCHEMA_VERSION}) give another run id — re-identify them with"
                f" `{MIGRATE} {records.path.parent.parent}`, or move that folder away"
            )
        mine, theirs = _flat(identity.fields()), _flat(recorded)
        key = next(k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k) != theirs.get(k))
        raise UserError(
            f"{records.path} holds records made with {key}={theirs.get(key)!r}, this config has {mine.get(key)!r}"
            " (a preset changed since) — move that folder away to rerun, or restore the preset"
        )


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, inner in value.items():
        out.update(_flat(inner, f"{prefix}.{key}" if prefix else key))
    return out


def execute(cfg: DictConfig, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run one configuration to completion (resuming) and return its summary.

    The run folder is made and locked in one step (``RunLock``); a run that ends without a
    record removes it again while still holding the lock, so a second process on the same run
    can neither remove the folder the first is writing nor write into one being removed.
    Only the records' own problems (another writer, a corrupt or duplicate line) are the
    user's to fix here: any other error is internal and keeps its traceback.
    """
    plan = prepare(cfg, overrides)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        with RunLock(plan.folder) as lock:
            try:
                return _run(plan)
            finally:
                lock.discard_unrecorded()
    except (RunBusyError, CorruptRecordsError, DuplicateRecordError) as error:
        raise UserError(str(error)) from error


def _run(plan: Plan) -> dict[str, Any]:
    cfg, task, run, folder = plan.cfg, plan.task, plan.run, plan.folder
    records = RecordFile(folder / "records.jsonl")
    _check_recorded(records, plan.identity, cfg.batch_size)
    diagnostics = CompanionFile(folder / DIAGNOSTICS_FILE, records) if cfg.diagnostics else None
    todo = [example for example in plan.examples if example.example_id not in records]
    log.info("%s: %d examples, %d already recorded, %d to run", run, len(plan.examples), len(records), len(todo))
    # One tracker run per job, finished (as failed) even when the loop raises.
    with open_logger(cfg, str(run)) as tracker:
        if todo:
            session = {"run_id": str(run), "identity": plan.identity.fields()}
            if plan.spec is not None:
                run_all, model = model_runner(plan, diagnostics)
                session |= provenance.collect(model.device)
                # A hub model without a pinned revision: the commit its files came from.
                session["model_commit"] = getattr(model.config, "_commit_hash", None)
                batches = run_all(todo)
            else:
                session |= provenance.collect(torch.device("cpu"))
                batches = task.run_batches(MethodPolicy(plan.method), todo)
            write_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
            append_lines(folder / "provenance.jsonl", [(json.dumps(session) + "\n").encode()])
            scores: list[float] = []
            progress = tqdm(total=len(todo), desc=f"{cfg.method.name} rho={cfg.rho}", unit="ex", dynamic_ncols=True)
            for batch in batches:
                made = [make_record(cfg, run, plan.identity, task, example, outcome) for example, outcome in batch]
                step = len(records)
                for record, written in zip(made, records.append_many(made), strict=True):
                    if written:
                        tracker.log_record(record, step=step)
                        step += 1
                    scores.append(next(iter(record["metrics"].values())))
                progress.update(len(made))
                progress.set_postfix(score=f"{sum(scores) / len(scores):.3g}", kv=f"{made[-1]['cache_len_final']}")
            progress.close()
        summary = summarize(records.records())
        summary["run_id"] = str(run)
        write_atomic(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
        tracker.log_summary(summary)
        log.info("%s: %s", run, json.dumps({k: summary.get(k) for k in ("n", "overall", "kv_ratio_final")}))
    return summary


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    hydra_config = HydraConfig.get()
    try:
        return execute(cfg, list(hydra_config.overrides.task))
    except UserError as error:
        # A sweep goes on with its other jobs and reports the first failure at the end; a single
        # run stops here, before Hydra adds its own report of the failed job, unless the user
        # asked for the traceback behind the line (HYDRA_FULL_ERROR=1).
        if hydra_config.mode == RunMode.MULTIRUN:
            log.error("error: %s", error)
            raise
        if show_tracebacks():
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli(main)
