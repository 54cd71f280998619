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
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness import provenance
from harness.engine import Engine, Generation
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.records import RecordFile
from harness.sampling import Sampling
from harness.summary import summarize
from methods.base import EvictionMethod
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
        f"{cfg.model.name}__{cfg.method.name}-{_digest(method)}__{task.name}-{_digest(task_identity)}"
        f"__rho{cfg.rho}__seed{cfg.seed}"
    )


def validate(cfg: DictConfig) -> None:
    rho = cfg.rho
    if not isinstance(rho, int | float) or not 0.0 <= float(rho) < 1.0:
        raise ValueError(f"rho={rho!r} is outside [0, 1): rho is the fraction of the prompt cache evicted")


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


def make_record(
    cfg: DictConfig,
    run: str,
    task: Task,
    example: Example,
    prediction: str,
    metrics: dict[str, float],
    generation: Generation,
) -> dict[str, Any]:
    decode_steps = max(generation.new_tokens - 1, 0)
    return {
        "run_id": run,
        "model": cfg.model.name,
        "method": cfg.method.name,
        "task": task.name,
        "subtask": example.subtask,
        "rho": cfg.rho,
        "seed": cfg.seed,
        "example_id": example.example_id,
        "prediction": prediction,
        "answers": example.answers,
        "metrics": metrics,
        "prefill_len": generation.prefill_len,
        "budget": generation.budget,
        "cache_len_final": generation.cache_len_final,
        "kv_bytes_final": generation.kv_bytes_final,
        "kv_bytes_full": generation.kv_bytes_full,
        "prefill_s": round(generation.prefill_s, 4),
        "decode_s": round(generation.decode_s, 4),
        "new_tokens": generation.new_tokens,
        "decode_tokens_per_s": round(decode_steps / generation.decode_s, 3) if generation.decode_s > 0 else None,
        "score_s": round(generation.score_s, 4),
        "evict_s": round(generation.evict_s, 4),
        "meta": example.meta,
    }


def execute(cfg: DictConfig) -> dict[str, Any]:
    """Run one configuration to completion (resuming) and return its summary."""
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    spec = ModelSpec(**OmegaConf.to_container(cfg.model, resolve=True))
    task: Task = instantiate(cfg.task)
    method: EvictionMethod = instantiate(cfg.method)
    sampling = Sampling(**OmegaConf.to_container(cfg.sampling, resolve=True))
    run = run_id(cfg, task)
    folder = Path(cfg.results_dir) / run
    records = RecordFile(folder / "records.jsonl")
    OmegaConf.save(cfg, folder / "config.yaml", resolve=True)

    tokenizer = load_tokenizer(spec)
    examples = task.examples(tokenizer)
    todo = [example for example in examples if example.example_id not in records]
    log.info(
        "%s: %d examples, %d already recorded, %d to run",
        run,
        len(examples),
        len(examples) - len(todo),
        len(todo),
    )
    if todo:
        model = load_model(spec)
        engine = Engine(model, method, sampling)
        for example in todo:
            engine.check(len(example.input_ids), example.max_new_tokens)
        with (folder / "provenance.jsonl").open("a") as handle:
            handle.write(json.dumps(provenance.collect(model.device)) + "\n")
        stops = stop_token_ids(model, tokenizer)
        scores: list[float] = []
        progress = tqdm(todo, desc=f"{cfg.method.name} rho={cfg.rho}", unit="ex", dynamic_ncols=True)
        for example in progress:
            generation = engine.generate(
                example.input_ids,
                example.max_new_tokens,
                stop_token_ids=stops,
                stop=stop_on_strings(tokenizer, task.stop_strings(example)),
                seed=example_seed(cfg.seed, example.example_id),
                forced=example.forced_ids,
            )
            prediction = tokenizer.decode(generation.tokens, skip_special_tokens=True)
            if example.forced_ids is None:
                metrics = task.score(prediction, example)
            else:
                metrics = task.score_logprobs(generation.target_logprobs, example)
            records.append(make_record(cfg, run, task, example, prediction, metrics, generation))
            scores.append(next(iter(metrics.values())))
            progress.set_postfix(score=f"{sum(scores) / len(scores):.1f}", kv=f"{generation.cache_len_final}")
    summary = summarize(records.records())
    summary["run_id"] = run
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s: %s", run, json.dumps({k: summary.get(k) for k in ("n", "overall", "kv_ratio_final")}))
    return summary


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    return execute(cfg)


if __name__ == "__main__":
    main()
