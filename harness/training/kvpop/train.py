"""Training the rows of KVpop's tables (``python -m harness.training.kvpop kvpop_recipe=<row>``).

KVpop (arXiv 2607.05061), Sec. 4. ``kvpop_recipe`` (``conf/kvpop_recipe/``) picks the row:

- ``kvpop`` (mLSTM, delayed readout), ``kvpop_mlp`` (MLP), ``kvpop_immediate`` (mLSTM read out at
  insertion, Fig. 5): the paper's joint recipe (``harness.training.joint``): the scorer learns
  from the boundary loss while the base model is KL-distilled under the scorer's pattern;
- ``streaming_llm_plus``: the base model distilled under sinks + recent tokens of the same budget;
- ``dms``: DMS's relaxed gates with the base model (``harness.training.dms``);
- ``scorer_only``: the earlier recipe: the frozen model's activations are captured once and the
  scorer alone trains on them (``loss=cutoff``: every candidate against the teacher's cutoff).

``output`` is a folder: ``model/`` (the fine-tuned base model with its tokenizer and
``evictbench_finetune.json``), ``policy.safetensors`` (+ ``.json``) and ``training.json`` (config
and history, token accuracy included); the scorer-only recipe writes the policy only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from transformers import PreTrainedModel

from harness.errors import user_errors
from harness.models import ModelSpec, file_sha256, load_model, load_tokenizer
from harness.training.dms import DMSPattern
from harness.training.joint import Pattern, Schedule, cosine_factor, fine_tune, token_accuracy
from harness.training.kvpop.capture import capture
from harness.training.kvpop.data import documents, packed_windows, token_windows
from harness.training.kvpop.loss import Weighting, boundary_loss, cutoff_loss, sample_queries
from harness.training.kvpop.pattern import KVpopPattern, StreamingPattern
from harness.training.kvpop.sparse import resolve_attention
from harness.training.kvpop.target import future_attention_target
from methods.kvpop.checkpoint import CheckpointInfo, save_checkpoint
from methods.kvpop.policy import state_entries
from methods.kvpop.ranking import candidates, decayed, retention_recall
from methods.kvpop.scorers import KVpopScorer, build_scorer

log = logging.getLogger(__name__)

RECIPES = ("joint", "streaming", "dms", "scorer_only")
LOSSES = ("boundary", "cutoff")


@dataclass
class Window:
    """One training sequence, all layers: ``keys``/``values`` ``(L, Hkv, S, D)``, ``target`` ``(L, Hkv, S)``."""

    keys: Tensor
    values: Tensor
    target: Tensor


def extract(model: PreTrainedModel, ids: list[int], window: int, eps: float, method: str) -> Window:
    """Capture one sequence and compute its future-attention targets layer by layer."""
    record = capture(model, ids)
    layers = sorted(record.keys)
    targets = [
        future_attention_target(record.queries[i], record.keys[i], record.scaling, window, eps, method)[0]
        for i in layers
    ]
    return Window(
        torch.stack([record.keys[i].float().cpu() for i in layers]),
        torch.stack([record.values[i].float().cpu() for i in layers]),
        torch.stack(targets).cpu(),
    )


def geometry(model: PreTrainedModel) -> tuple[int, int, int]:
    config = model.config.get_text_config()
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, kv_heads, head_dim


def make_scorer(cfg: DictConfig, layers: int, kv_heads: int, head_dim: int) -> KVpopScorer:
    """The scorer ``kvpop.*`` describes; ``cell_dim``/``hidden`` null take ``head_dim / 2`` / ``head_dim``."""
    hyper: dict[str, Any] = {"gamma_min": cfg.gamma_min, "gamma_max": cfg.gamma_max, "gamma_space": cfg.gamma_space}
    if cfg.scorer == "mlp":
        hyper["hidden"] = cfg.hidden if cfg.hidden is not None else head_dim
    else:
        cell = cfg.cell_dim if cfg.cell_dim is not None else head_dim // 2
        hyper.update(cell_dim=cell, delay=cfg.window if cfg.delayed else 0, chunk=cfg.chunk, readout=cfg.readout)
    return build_scorer(cfg.scorer, layers, kv_heads, head_dim, **hyper)


def make_gate(cfg: DictConfig, layers: int, kv_heads: int, head_dim: int) -> KVpopScorer:
    """DMS's gate: the KVpop MLP (same parameter count), without decay (``gamma = 1``)."""
    hidden = cfg.hidden if cfg.hidden is not None else head_dim
    return build_scorer("mlp", layers, kv_heads, head_dim, gamma_min=1.0, gamma_max=1.0, hidden=hidden)


def trained_k(cfg: DictConfig, scorer: KVpopScorer | None, dtype: torch.dtype) -> int:
    """``k``: ``kvpop.k``, else ``B - s - w`` less the scorer state's entries with ``count_state``."""
    if cfg.k is not None:
        return cfg.k
    state = state_entries(scorer, dtype) if scorer is not None and cfg.count_state else 0
    k = cfg.budget - cfg.sinks - cfg.window - state
    if k < 1:
        raise ValueError(
            f"kvpop.budget={cfg.budget} leaves no older tokens beyond sinks+window={cfg.sinks}+{cfg.window}"
            + (f" and the scorer state's {state} entries" if state else "")
            + " — raise kvpop.budget or shrink kvpop.window"
        )
    return k


def check(cfg: DictConfig) -> None:
    """Refuse options that could only fail after minutes of training."""
    if cfg.recipe not in RECIPES:
        raise ValueError(
            f"recipe={cfg.recipe!r} is not a recipe — pick a row with kvpop_recipe=<name> (conf/kvpop_recipe/)"
        )
    if cfg.train.loss not in LOSSES:
        raise ValueError(f"train.loss={cfg.train.loss!r} is not a loss — use boundary (Eq. 7) or cutoff")
    if cfg.kvpop.bucket != 1 and cfg.recipe != "scorer_only":
        raise ValueError(
            f"kvpop.bucket={cfg.kvpop.bucket!r} with recipe={cfg.recipe} — the training pattern needs static "
            "priorities: set kvpop.bucket=1"
        )
    if cfg.recipe == "streaming" and cfg.train.base_lr <= 0:
        raise ValueError("recipe=streaming trains only the base model — set train.base_lr above 0, e.g. 8e-5")


def _windows(cfg: DictConfig, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    data = cfg.data
    hub = OmegaConf.to_container(data.hub, resolve=True) if data.hub is not None else None
    texts = documents(data.file, hub)
    cut = packed_windows if data.packing else token_windows
    both = cut(tokenizer, texts, data.length, data.windows + data.heldout, data.skip)
    return both[: data.windows], both[data.windows :]


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the row ``cfg`` describes and save it; returns a summary (history included)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(cfg.train.seed)
    with user_errors():
        check(cfg)
        spec = ModelSpec.from_config(cfg.model)
        tokenizer = load_tokenizer(spec)
        windows, heldout = _windows(cfg, tokenizer)
    if cfg.recipe == "scorer_only":
        return train_scorer_only(cfg, spec, windows)
    return train_joint(cfg, spec, tokenizer, windows, heldout)


def _input_stats(scorer: KVpopScorer, model: PreTrainedModel, windows: list[list[int]]) -> None:
    """Standardise the scorer's inputs with the dense model's keys and values on a few windows."""
    records = [capture(model, ids) for ids in windows[:2]]
    features = torch.cat(
        [torch.stack([torch.cat([r.keys[i], r.values[i]], -1).float().cpu() for i in sorted(r.keys)]) for r in records],
        dim=-2,
    )
    scorer.set_input_stats(features)


def train_joint(
    cfg: DictConfig, spec: ModelSpec, tokenizer: Any, windows: list[list[int]], heldout: list[list[int]]
) -> dict[str, Any]:
    """KVpop's joint recipe and the trained baselines: fine-tune under the pattern, save model and policy."""
    kvpop, opt = cfg.kvpop, cfg.train
    teacher = load_model(spec).requires_grad_(False)
    student = load_model(spec).train()
    layers, kv_heads, head_dim = geometry(student)
    attention = resolve_attention(opt.attention, student.device)
    generator = torch.Generator().manual_seed(opt.seed)
    weighting = Weighting(opt.margin_min, opt.margin_tau, opt.balance, opt.balance_min, opt.balance_max)
    with user_errors():
        pattern: Pattern
        if cfg.recipe == "joint":
            scorer = make_scorer(kvpop, layers, kv_heads, head_dim).to(student.device)
            k = trained_k(kvpop, scorer, student.dtype)
            pattern = KVpopPattern(
                scorer, kvpop.sinks, kvpop.window, k, kvpop.budget, opt, weighting, attention, generator
            )
        elif cfg.recipe == "dms":
            scorer = make_gate(kvpop, layers, kv_heads, head_dim).to(student.device)
            k = trained_k(kvpop, None, student.dtype)
            pattern = DMSPattern(
                scorer, kvpop.sinks, kvpop.window, k, cfg.data.length, cfg.dms.temperature, cfg.dms.weight,
                cfg.dms.anneal_steps, attention, generator,
            )  # fmt: skip
        else:
            scorer, k = None, trained_k(kvpop, None, student.dtype)
            pattern = StreamingPattern(kvpop.sinks, kvpop.window, k, attention)
        if pattern.first >= cfg.data.length:
            raise ValueError(
                f"the budget binds from position {pattern.first} on, beyond the training windows of "
                f"data.length={cfg.data.length} tokens — raise data.length or lower kvpop.budget"
            )
    if scorer is not None:
        _input_stats(scorer, teacher, windows)
    schedule = Schedule(
        opt.steps, opt.lr, opt.base_lr, opt.warmup, opt.min_lr_ratio, opt.weight_decay, opt.clip,
        opt.distill_weight, opt.eval_every, opt.log_every, opt.cache_teacher,
    )  # fmt: skip
    start = time.perf_counter()
    history = fine_tune(student, teacher, pattern, windows, heldout, schedule)
    train_s = time.perf_counter() - start
    dense_accuracy = token_accuracy(teacher, None, heldout, pattern.first)
    folder = Path(cfg.output)
    model_dir = folder / "model"
    student.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    policy = pattern.save(folder, model_dir, history, config)
    record = dataclasses.replace(
        pattern.finetune(spec.name),
        policy=None if policy is None else str(policy),
        weights_sha256=file_sha256(model_dir / "model.safetensors"),
    )
    record.write(model_dir)
    summary = {
        "output": str(folder),
        "model": str(model_dir),
        "policy": None if policy is None else str(policy),
        "k": k,
        "history": history,
        "teacher_token_accuracy": dense_accuracy,
        "train_s": train_s,
        "config": config,
    }
    (folder / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("saved %s (training %.1fs)", folder, train_s)
    return summary


def objective(
    scorer: KVpopScorer, batch: Window, queries: Tensor, k: int, kvpop: DictConfig, train: DictConfig
) -> tuple[Tensor, Tensor]:
    """Loss and mean retention recall of one captured window at the sampled query positions."""
    scores = scorer(batch.keys, batch.values)
    log_gamma = scorer.log_gamma()
    # The teacher ranks with the same decay, but the decay learns only through the student.
    teacher = decayed(batch.target, queries, log_gamma.detach(), kvpop.bucket)
    student = decayed(scores, queries, log_gamma, kvpop.bucket)
    mask = candidates(queries, scores.shape[-1], kvpop.sinks, kvpop.window)
    if train.loss == "cutoff":
        loss = cutoff_loss(student, teacher, mask.expand_as(student), k, train.temperature, train.cutoff_margin)
    else:
        weighting = Weighting(train.margin_min, train.margin_tau, train.balance, train.balance_min, train.balance_max)
        flat = student.flatten(0, 1), teacher.flatten(0, 1)
        loss = boundary_loss(*flat, mask, queries, kvpop.window, k, train.temperature, weighting, train.boundary)
    recall = retention_recall(student.detach(), teacher, mask.expand_as(student), k).mean()
    return loss, recall


def train_scorer_only(cfg: DictConfig, spec: ModelSpec, ids: list[list[int]]) -> dict[str, Any]:
    """The scorer alone on the frozen model's activations, captured once."""
    kvpop, data, opt = cfg.kvpop, cfg.data, cfg.train
    model = load_model(spec)
    start = time.perf_counter()
    windows = [extract(model, window, kvpop.window, opt.eps, opt.target_method) for window in ids]
    extract_s = time.perf_counter() - start
    log.info("captured %d windows of %d tokens in %.1fs", len(windows), data.length, extract_s)

    layers, kv_heads, head_dim = geometry(model)
    with user_errors():
        scorer = make_scorer(kvpop, layers, kv_heads, head_dim)
        k = trained_k(kvpop, scorer, model.dtype)
    features = torch.cat([torch.cat([w.keys, w.values], -1) for w in windows], dim=-2)
    scorer.set_input_stats(features)
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, opt.steps, opt.warmup, opt.min_lr_ratio)
    )
    generator = torch.Generator().manual_seed(opt.seed)
    first = kvpop.sinks + kvpop.window + k
    history: list[dict[str, float]] = []
    running: list[tuple[float, float]] = []
    start = time.perf_counter()
    for step in range(opt.steps):
        batch = windows[step % len(windows)]
        with user_errors():
            queries = sample_queries(data.length, first, opt.queries, opt.late_fraction, generator, opt.late_power)
        loss, recall = objective(scorer, batch, queries, k, kvpop, opt)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(scorer.parameters(), opt.clip)
        optimizer.step()
        schedule.step()
        running.append((loss.item(), recall.item()))
        if (step + 1) % opt.log_every == 0 or step + 1 == opt.steps:
            point = {
                "step": step + 1,
                "loss": sum(r[0] for r in running) / len(running),
                "recall": sum(r[1] for r in running) / len(running),
                "gamma_mean": scorer.log_gamma().exp().mean().item(),
                "seconds": time.perf_counter() - start,
            }
            history.append(point)
            running.clear()
            log.info("step %(step)d loss %(loss).4f recall %(recall).3f gamma %(gamma_mean).4f", point)
    train_s = time.perf_counter() - start

    config = OmegaConf.to_container(cfg, resolve=True)
    info = CheckpointInfo(
        model=spec.name,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        scorer=scorer.hyperparameters(),
        policy={"sinks": kvpop.sinks, "window": kvpop.window, "k": k, "bucket": kvpop.bucket, "budget": kvpop.budget},
        train={"config": config, "history": history, "extract_s": extract_s, "train_s": train_s},
    )
    path = save_checkpoint(scorer, Path(cfg.output) / "policy.safetensors", info)
    log.info("saved %s (training %.1fs)", path, train_s)
    return {
        "output": cfg.output,
        "policy": str(path),
        "k": k,
        "history": history,
        "extract_s": extract_s,
        "train_s": train_s,
    }
