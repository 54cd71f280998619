"""Training a KVpop scorer (``python -m harness.training.kvpop``).

KVpop (openreview R54wzDIb0L): the frozen model runs over training windows once; every layer's
post-RoPE q/k/v are captured and turned into the future-attention target per KV head
(``harness.training.kvpop.target``). The scorer then trains on the detached ``[k; v]`` with the pairwise
boundary loss at query positions sampled after saturation (``harness.training.kvpop.loss``), AdamW with
a warmup + cosine schedule, and is saved as safetensors with its config
(``methods.kvpop.checkpoint``), ready for ``method=kvpop method.checkpoint=<path>``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from transformers import PreTrainedModel

from harness.errors import user_errors
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.training.kvpop.capture import capture
from harness.training.kvpop.data import documents, token_windows
from harness.training.kvpop.loss import boundary_loss, candidates, decayed, retention_recall, sample_queries
from harness.training.kvpop.sparse import distillation_loss, kvpop_mask, streaming_mask
from harness.training.kvpop.target import future_attention_target
from methods.kvpop.checkpoint import CheckpointInfo, save_checkpoint
from methods.kvpop.policy import static_base
from methods.kvpop.scorers import KVpopScorer, build_scorer

log = logging.getLogger(__name__)


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
    hyper: dict[str, Any] = {"gamma_min": cfg.gamma_min, "gamma_max": cfg.gamma_max}
    if cfg.scorer == "mlp":
        hyper["hidden"] = cfg.hidden
    else:
        hyper.update(cell_dim=cfg.cell_dim, delay=cfg.window if cfg.delayed else 0, chunk=cfg.chunk)
    return build_scorer(cfg.scorer, layers, kv_heads, head_dim, **hyper)


def cosine_factor(step: int, steps: int, warmup: int, floor: float) -> float:
    """Linear warmup to 1, then cosine decay to ``floor`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def objective(
    scorer: KVpopScorer, batch: Window, queries: Tensor, kvpop: DictConfig, train: DictConfig
) -> tuple[Tensor, Tensor]:
    """Loss and mean retention recall of one window at the sampled query positions."""
    scores = scorer(batch.keys, batch.values)
    log_gamma = scorer.log_gamma()
    # The teacher ranks with the same decay, but the decay learns only through the student.
    teacher = decayed(batch.target, queries, log_gamma.detach(), kvpop.bucket)
    student = decayed(scores, queries, log_gamma, kvpop.bucket)
    mask = candidates(queries, scores.shape[-1], kvpop.sinks, kvpop.window).expand_as(student)
    loss = boundary_loss(student, teacher, mask, kvpop.k, train.temperature, train.margin)
    recall = retention_recall(student.detach(), teacher, mask, kvpop.k).mean()
    return loss, recall


def distill(
    model: PreTrainedModel, scorer: KVpopScorer, ids: list[list[int]], windows: list[Window], cfg: DictConfig
) -> dict[str, Any]:
    """Optional stage 2: fine-tune the base model under the fixed-budget sparse pattern (KL to the dense model).

    ``distill.pattern=kvpop`` uses the trained scorer's static priorities (frozen, from the frozen
    model's keys and values); ``streaming`` is the StreamingLLM+ baseline (sinks + recent, same budget).
    """
    kvpop, options = cfg.kvpop, cfg.distill
    masks_per_window = []
    for window in windows:
        length = window.keys.shape[-2]
        if options.pattern == "streaming":
            masks_per_window.append(
                [streaming_mask(length, kvpop.sinks, kvpop.window, kvpop.k)[None]] * len(window.keys)
            )
            continue
        with torch.no_grad():
            priority = static_base(
                scorer(window.keys, window.values), torch.arange(length), scorer.log_gamma()[..., None], 1
            )
        masks_per_window.append([kvpop_mask(layer, kvpop.sinks, kvpop.window, kvpop.k) for layer in priority])
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr)
    history = []
    for step in range(options.steps):
        index = step % len(ids)
        batch = torch.tensor([ids[index]], device=model.device)
        loss = distillation_loss(model, batch, masks_per_window[index], kvpop.sinks + kvpop.window + kvpop.k)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip)
        optimizer.step()
        history.append({"step": step + 1, "kl": loss.item()})
        log.info("distill step %d KL %.4f", step + 1, loss.item())
    model.save_pretrained(options.output)
    return {"model": options.output, "history": history}


def check_distill(cfg: DictConfig) -> None:
    """Refuse distillation options that could only fail after the scorer has trained."""
    if not cfg.distill.enabled:
        return
    if cfg.distill.pattern not in ("kvpop", "streaming"):
        raise ValueError(f"distill.pattern={cfg.distill.pattern!r} is not a pattern — use kvpop or streaming")
    if cfg.kvpop.bucket != 1:
        raise ValueError(
            f"kvpop.bucket={cfg.kvpop.bucket!r} with distill.enabled=true — distillation needs static priorities:"
            " set kvpop.bucket=1"
        )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train, save the checkpoint, return a summary (loss curve included)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    kvpop, data, opt = cfg.kvpop, cfg.data, cfg.train
    torch.manual_seed(opt.seed)
    with user_errors():
        check_distill(cfg)
        spec = ModelSpec.from_config(cfg.model)
        tokenizer = load_tokenizer(spec)
        hub = OmegaConf.to_container(data.hub, resolve=True) if data.hub is not None else None
        ids = token_windows(tokenizer, documents(data.file, hub), data.length, data.windows, data.skip)
    model = load_model(spec)
    start = time.perf_counter()
    windows = [extract(model, window, kvpop.window, opt.eps, opt.target_method) for window in ids]
    extract_s = time.perf_counter() - start
    log.info("captured %d windows of %d tokens in %.1fs", len(windows), data.length, extract_s)

    layers, kv_heads, head_dim = geometry(model)
    scorer = make_scorer(kvpop, layers, kv_heads, head_dim)
    features = torch.cat([torch.cat([w.keys, w.values], -1) for w in windows], dim=-2)
    scorer.set_input_stats(features)
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, opt.steps, opt.warmup, opt.min_lr_ratio)
    )
    generator = torch.Generator().manual_seed(opt.seed)
    first = kvpop.sinks + kvpop.window + kvpop.k
    history: list[dict[str, float]] = []
    running: list[tuple[float, float]] = []
    start = time.perf_counter()
    for step in range(opt.steps):
        batch = windows[step % len(windows)]
        queries = sample_queries(data.length, first, opt.queries, opt.late_fraction, generator, opt.late_power)
        loss, recall = objective(scorer, batch, queries, kvpop, opt)
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
        policy={"sinks": kvpop.sinks, "window": kvpop.window, "k": kvpop.k, "bucket": kvpop.bucket},
        train={"config": config, "history": history, "extract_s": extract_s, "train_s": train_s},
    )
    path = save_checkpoint(scorer, cfg.output, info)
    log.info("saved %s (training %.1fs)", path, train_s)
    summary = {"checkpoint": str(path), "history": history, "extract_s": extract_s, "train_s": train_s}
    if cfg.distill.enabled:
        summary["distill"] = distill(model, scorer, ids, windows, cfg)
    return summary
