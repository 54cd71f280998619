"""``python -m harness.run model=... method=... task=... rho=... seed=...``

Composes the config (``conf/``), runs every example not yet recorded in the run's folder and
appends one record per example. The folder name is derived from the config, so rerunning
the same command resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness import provenance
from harness.diagnostics import RetentionRecorder
from harness.engine import Engine
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.records import RecordFile
from harness.sampling import Sampling
from harness.summary import summarize
from harness.wandb_logger import open_logger
from methods.base import EvictionMethod
from methods.full import FullCache
from methods.selection import check_rho
from tasks.base import Example, Task

log = logging.getLogger(__name__)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def run_id(cfg: DictConfig, task: Task) -> str:
    """``<model>__<method>-<hash>__<task>-<hash>__rho<rho>__seed<seed>``, from the config alone.

    The method hash covers every method parameter (scorer, aggregation, selection); the task
    hash covers the fields that define what an example is, not which examples run; sampling
    enters the task hash only when it is not greedy.
    """
    method = OmegaConf.to_container(cfg.method, resolve=True)
    method.pop("name", None)
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    task_identity = dict(task.identity())
    if sampling["temperature"] > 0:
        task_identity["sampling"] = sampling
    return (
        f"{model_name(cfg, task)}__{cfg.method.name}-{_digest(method)}__{task.name}-{_digest(task_identity)}"
        f"__rho{cfg.rho}__seed{cfg.seed}"
    )


def validate(cfg: DictConfig) -> None:
    # Checked before anything loads, also for methods without a budget (full).
    check_rho(cfg.rho)


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


RECORD_FIELDS = (
    "prediction", "metrics", "prefill_len", "budget", "cache_len_final", "kv_bytes_final", "kv_bytes_full",
    "prefill_s", "decode_s", "new_tokens", "decode_tokens_per_s", "score_s", "evict_s",
)  # fmt: skip


# What a record keeps of a protocol's second, full-cache generation (``Task.follow_up``).
ANSWER_PASS_FIELDS = ("prefill_len", "new_tokens", "prefill_s", "decode_s")


def model_name(cfg: DictConfig, task: Task) -> str:
    """The evaluated model, or ``world`` for tasks that simulate their own attention (dialogs)."""
    return cfg.model.name if getattr(task, "needs_model", True) else "world"


def make_record(cfg: DictConfig, run: str, task: Task, example: Example, outcome: dict[str, Any]) -> dict[str, Any]:
    """One line of ``records.jsonl``: identity, the outcome's public fields, the rest under ``meta``."""
    outcome = dict(outcome)
    decode_steps = max(outcome["new_tokens"] - 1, 0)
    if outcome.get("decode_tokens_per_s") is None and outcome["decode_s"] > 0:
        outcome["decode_tokens_per_s"] = decode_steps / outcome["decode_s"]
    record = {
        "run_id": run,
        "model": model_name(cfg, task),
        "method": cfg.method.name,
        "task": task.name,
        "subtask": example.subtask,
        "rho": cfg.rho,
        "seed": cfg.seed,
        "example_id": example.example_id,
        "answers": example.answers,
    }
    for name in RECORD_FIELDS:
        value = outcome.pop(name, 0.0 if name.endswith("_s") else None)
        record[name] = round(value, 4) if isinstance(value, float) else value
    record["meta"] = {**example.meta, **outcome}
    return record


def model_runner(
    cfg: DictConfig,
    spec: ModelSpec,
    task: Task,
    method: EvictionMethod,
    tokenizer: Any,
    todo: list[Example],
    folder: Path,
) -> tuple[Callable[[Example], dict[str, Any]], torch.device]:
    """Load the model, check every pending example against the method, return the per-example runner.

    With ``diagnostics=true`` every example's per-step retained sets and scores go to
    ``<run>/diagnostics.jsonl`` (decode then computes attention weights at every step, so its
    timings are not comparable with a plain run).
    """
    model = load_model(spec)
    sampling = Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True))
    engine = Engine(model, method, sampling)
    # Attached before the first sequence: the recorder wraps the method's scorer.
    recorder = RetentionRecorder.attach(engine) if cfg.diagnostics else None
    for example in todo:
        engine.check(len(example.input_ids), example.max_new_tokens)
    stops = stop_token_ids(model, tokenizer)
    answer_engine = Engine(model, FullCache(), sampling)

    def generate(on: Engine, example: Example) -> Any:
        return on.generate(
            example.input_ids,
            example.max_new_tokens,
            stop_token_ids=stops | set(example.stop_token_ids),
            stop=stop_on_strings(tokenizer, task.stop_strings(example)),
            seed=example_seed(cfg.seed, example.example_id),
            forced=example.forced_ids,
            min_new_tokens=example.min_new_tokens,
        )

    def run_one(example: Example) -> dict[str, Any]:
        generation = generate(engine, example)
        if recorder is not None:
            recorder.write(folder, example.example_id, example.subtask)
        prediction = tokenizer.decode(generation.tokens, skip_special_tokens=True)
        outcome = {name: getattr(generation, name) for name in RECORD_FIELDS[2:] if hasattr(generation, name)}
        if example.forced_ids is not None:
            metrics = task.score_logprobs(generation.target_logprobs, example)
        else:
            follow_up = task.follow_up(tokenizer, example, prediction)
            if follow_up is not None:
                answer = generate(answer_engine, follow_up)
                outcome["first_prediction"] = prediction
                outcome["answer_pass"] = {name: getattr(answer, name) for name in ANSWER_PASS_FIELDS}
                prediction, example = tokenizer.decode(answer.tokens, skip_special_tokens=True), follow_up
            metrics = task.score(prediction, example)
        return {"prediction": prediction, "metrics": metrics, **outcome}

    return run_one, model.device


def execute(cfg: DictConfig) -> dict[str, Any]:
    """Run one configuration to completion (resuming) and return its summary."""
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    task: Task = instantiate(cfg.task)
    method: EvictionMethod = instantiate(cfg.method)
    uses_model = getattr(task, "needs_model", True)
    spec = ModelSpec.from_config(cfg.model) if uses_model else None
    run = run_id(cfg, task)
    folder = Path(cfg.results_dir) / run
    records = RecordFile(folder / "records.jsonl")
    OmegaConf.save(cfg, folder / "config.yaml", resolve=True)

    tokenizer = load_tokenizer(spec) if uses_model else None
    examples = task.examples(tokenizer)
    todo = [example for example in examples if example.example_id not in records]
    log.info(
        "%s: %d examples, %d already recorded, %d to run", run, len(examples), len(examples) - len(todo), len(todo)
    )
    # One tracker run per job, finished (as failed) even when the loop raises.
    with open_logger(cfg, run) as tracker:
        if todo:
            if uses_model:
                run_one, device = model_runner(cfg, spec, task, method, tokenizer, todo, folder)
            else:
                run_one, device = partial(task.run_example, method), torch.device("cpu")
            with (folder / "provenance.jsonl").open("a") as handle:
                handle.write(json.dumps(provenance.collect(device)) + "\n")
            scores: list[float] = []
            progress = tqdm(todo, desc=f"{cfg.method.name} rho={cfg.rho}", unit="ex", dynamic_ncols=True)
            for example in progress:
                record = make_record(cfg, run, task, example, run_one(example))
                records.append(record)
                tracker.log_record(record, step=len(records) - 1)
                scores.append(next(iter(record["metrics"].values())))
                progress.set_postfix(score=f"{sum(scores) / len(scores):.3g}", kv=f"{record['cache_len_final']}")
        summary = summarize(records.records())
        summary["run_id"] = run
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        tracker.log_summary(summary)
        log.info("%s: %s", run, json.dumps({k: summary.get(k) for k in ("n", "overall", "kv_ratio_final")}))
    return summary


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    return execute(cfg)


if __name__ == "__main__":
    main()
