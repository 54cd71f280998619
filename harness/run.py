"""``python -m harness.run model=... method=... task=... rho=... seed=...``

Composes the config (``conf/``), checks everything a user can get wrong before any weights
load and before anything is written (``prepare``), then runs every example not yet recorded in
the run's folder and appends one record per example (``execute``). The folder name is derived
from the config (``harness.record.identity``), so rerunning the same command resumes where it
stopped. The rooms it joins::

    prepare:  harness.config (options) -> tasks, methods (instantiated) -> harness.models (spec, tokenizer)
              -> harness.record.identity (run id) -> harness.protocols.requests (every example checked)
    execute:  harness.record.files (lock, records) -> harness.protocols (outcomes: the model under the
              method, or the dialog world) -> harness.record.assemble (records) -> summary, provenance
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness.config import check_options, check_top_level
from harness.decode import kv_cache
from harness.decode.retention import FILENAME as DIAGNOSTICS_FILE
from harness.decode.sampling import Sampling
from harness.errors import UserError, cli, show_tracebacks, user_errors
from harness.models import ModelSpec, check_buildable, check_device, load_config, load_model, load_tokenizer
from harness.options import check_types
from harness.protocols.dialog_world import run_in_world
from harness.protocols.model import run_on_model
from harness.protocols.requests import check_examples
from harness.record import provenance
from harness.record.assemble import make_record
from harness.record.files import (
    CompanionFile,
    CorruptRecordsError,
    DuplicateRecordError,
    RecordFile,
    RunBusyError,
    RunLock,
    append_lines,
    writable_folder,
    write_atomic,
)
from harness.record.identity import MIGRATE, Identity, check_recorded, identify, older_folders
from harness.record.schema import SCHEMA_VERSION, Outcome, RunId
from harness.record.summary import summarize
from harness.record.wandb_logger import open_logger
from methods.base import EvictionMethod
from tasks.base import Example, Task, TaskProtocol

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """A run checked against the user's mistakes, before anything loads weights or writes.

    Parameters:
        cfg: the composed config.
        task, method: instantiated from it.
        spec, tokenizer: the model's spec and tokenizer (None for tasks that need no model).
        run, identity: the run id and what it is computed from.
        examples: every example of the task.
        folder: the run's results folder.
    """

    cfg: DictConfig
    task: Task
    method: EvictionMethod
    spec: ModelSpec | None
    tokenizer: Any
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
        results = writable_folder(Path(cfg.results_dir), "results_dir")
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
            sampling = Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True))
            check_examples(examples, task, model_config, method, sampling, cfg.diagnostics)
    return Plan(cfg, task, method, spec, tokenizer, run, identity, examples, results / str(run))


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


def _outcomes(plan: Plan, todo: list[Example], session: dict[str, Any]) -> Iterator[list[tuple[Example, Outcome]]]:
    """The outcomes of ``todo`` as they come; ``session`` gets the provenance of what runs them."""
    cfg = plan.cfg
    if plan.spec is None:
        session |= provenance.collect(torch.device("cpu"))
        return run_in_world(plan.task, plan.method, todo)
    model = load_model(plan.spec)
    session |= provenance.collect(model.device)
    # A hub model without a pinned revision: the commit its files came from.
    session["model_commit"] = getattr(model.config, "_commit_hash", None)
    sampling = Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True))
    return run_on_model(
        model,
        plan.task,
        plan.method,
        plan.tokenizer,
        sampling,
        cfg.seed,
        cfg.batch_size,
        cfg.diagnostics,
        todo,
        profile=cfg.profile,
        numerics=cfg.numerics,
    )


def _run(plan: Plan) -> dict[str, Any]:
    cfg, run, folder = plan.cfg, plan.run, plan.folder
    records = RecordFile(folder / "records.jsonl")
    try:
        check_recorded(records.records(), plan.identity, cfg.batch_size, records.path)
    except ValueError as error:
        raise UserError(str(error)) from None
    diagnostics = CompanionFile(folder / DIAGNOSTICS_FILE, records) if cfg.diagnostics else None
    todo = [example for example in plan.examples if example.example_id not in records]
    log.info("%s: %d examples, %d already recorded, %d to run", run, len(plan.examples), len(records), len(todo))
    # One tracker run per job, finished (as failed) even when the loop raises.
    with open_logger(cfg, str(run)) as tracker:
        if todo:
            session: dict[str, Any] = {"run_id": str(run), "identity": plan.identity.fields()}
            batches = _outcomes(plan, todo, session)
            write_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
            append_lines(folder / "provenance.jsonl", [(json.dumps(session) + "\n").encode()])
            scores: list[float] = []
            progress = tqdm(total=len(todo), desc=f"{cfg.method.name} rho={cfg.rho}", unit="ex", dynamic_ncols=True)
            for batch in batches:
                made = []
                for example, outcome in batch:
                    if diagnostics is not None and outcome.trace is not None:
                        diagnostics.append(outcome.trace)
                    made.append(make_record(run, plan.identity, cfg.rho, cfg.seed, example, outcome))
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
