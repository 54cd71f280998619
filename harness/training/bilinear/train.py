"""Training InertiaKV's bilinear scorer (``python -m harness.training.bilinear``).

The frozen model reads training windows once; every layer's post-RoPE queries and keys are kept
(``harness.training.kvpop.capture``). Each step takes a window and a layer, draws query rows,
and fits the head's softmax to the model's attention there (``harness.training.bilinear.loss``),
with AdamW. Held-out windows then measure how far the head's ranking is from attention at the
last query of each window: Spearman correlation and top-10% Jaccard at ``eval.layer`` (the
paper's layer 15; it reports rho ~ 0.05, Jaccard ~ 0.08 on Llama-3.1-8B). The head is saved with
its model, geometry, loss curve and those figures (``methods.scorers.bilinear``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from statistics import fmean
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from harness.errors import user_errors
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.training.bilinear.loss import agreement, causal_mask, distillation_loss, teacher_attention
from harness.training.kvpop.capture import capture
from harness.training.kvpop.data import token_windows
from methods.options import require_int, require_number
from methods.scorers.bilinear import BilinearHead, BilinearInfo, flat_keys, flat_queries, save_bilinear
from tasks.corpora import read_text

log = logging.getLogger(__name__)


@dataclass
class Window:
    """One captured sequence: per layer ``queries`` ``(H, S, D)`` and ``keys`` ``(Hkv, S, D)``, float32 on the CPU."""

    queries: list[Tensor]
    keys: list[Tensor]
    scaling: float


def check(cfg: DictConfig) -> None:
    """Refuse options that could only fail after the model has loaded."""
    require_int("bilinear.rank", cfg.bilinear.rank, minimum=1, example=64)
    require_number("loss.kl_weight", cfg.loss.kl_weight, 0.1, minimum=0.0)
    require_number("loss.temperature", cfg.loss.temperature, 1.0, minimum=1e-6)
    for option, minimum, example in (
        ("data.length", 2, 512),
        ("data.windows", 1, 8),
        ("data.held_out", 1, 2),
        ("train.steps", 1, 300),
        ("train.rows", 1, 32),
        ("train.min_position", 0, 16),
    ):
        section, name = option.split(".")
        require_int(option, cfg[section][name], minimum=minimum, example=example)
    if cfg.train.min_position >= cfg.data.length:
        raise ValueError(
            f"train.min_position={cfg.train.min_position} leaves no query row in windows of data.length="
            f"{cfg.data.length} tokens — lower it below the window length"
        )


def captured(model: Any, ids: list[int]) -> Window:
    record = capture(model, ids)
    layers = sorted(record.keys)
    return Window(
        [record.queries[i].float().cpu().clone() for i in layers],
        [record.keys[i].float().cpu().clone() for i in layers],
        record.scaling,
    )


def held_out_agreement(head: BilinearHead, windows: list[Window], layer: int, fraction: float) -> dict[str, float]:
    """Mean Spearman and top-``fraction`` Jaccard of the head's scores against attention, last query of each window."""
    spearmans, jaccards = [], []
    with torch.no_grad():
        for window in windows:
            queries, keys = window.queries[layer], window.keys[layer]
            last = torch.tensor([keys.shape[1] - 1])
            teacher = teacher_attention(queries, keys, last, window.scaling)[0]
            scores = head.logits(flat_queries(queries[:, last]), flat_keys(keys), layer)[0]
            spearman, jaccard = agreement(scores, teacher, fraction)
            spearmans.append(spearman)
            jaccards.append(jaccard)
    return {"layer": layer, "spearman": fmean(spearmans), "jaccard": fmean(jaccards), "budget_fraction": fraction}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train, save the head, return a summary (loss curve and held-out agreement)."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    data, opt = cfg.data, cfg.train
    with user_errors():
        check(cfg)
        spec = ModelSpec.from_config(cfg.model)
        tokenizer = load_tokenizer(spec)
        text = read_text(data.file, "data.file")
        ids = token_windows(tokenizer, [text], data.length, data.windows + data.held_out, data.skip)
    model = load_model(spec)
    start = time.perf_counter()
    windows = [captured(model, window) for window in ids]
    extract_s = time.perf_counter() - start
    training, held_out = windows[: data.windows], windows[data.windows :]

    text_config = model.config.get_text_config()
    layers = text_config.num_hidden_layers
    query_heads, dim = windows[0].queries[0].shape[0], windows[0].queries[0].shape[-1]
    kv_heads = windows[0].keys[0].shape[0]
    sets = layers if cfg.bilinear.per_layer else 1
    torch.manual_seed(opt.seed)
    head = BilinearHead(sets, query_heads * dim, kv_heads * dim, cfg.bilinear.rank)
    optimizer = torch.optim.AdamW(head.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
    generator = torch.Generator().manual_seed(opt.seed)
    history: list[dict[str, float]] = []
    running: list[float] = []
    start = time.perf_counter()
    for step in range(opt.steps):
        window = training[step % len(training)]
        layer = int(torch.randint(layers, (1,), generator=generator))
        queries, keys = window.queries[layer], window.keys[layer]
        length = keys.shape[1]
        rows = torch.randint(opt.min_position, length, (opt.rows,), generator=generator)
        teacher = teacher_attention(queries, keys, rows, window.scaling)
        logits = head.logits(flat_queries(queries[:, rows]), flat_keys(keys), layer)
        loss = distillation_loss(logits, teacher, causal_mask(rows, length), cfg.loss.kl_weight, cfg.loss.temperature)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running.append(loss.item())
        if (step + 1) % opt.log_every == 0 or step + 1 == opt.steps:
            history.append({"step": step + 1, "loss": fmean(running), "seconds": time.perf_counter() - start})
            running.clear()
            log.info("step %(step)d loss %(loss).4f", history[-1])
    train_s = time.perf_counter() - start
    evaluation = held_out_agreement(head, held_out, min(cfg.eval.layer, layers - 1), cfg.eval.budget_fraction)
    log.info("held out, layer %(layer)d: Spearman %(spearman).3f, top-B Jaccard %(jaccard).3f", evaluation)

    info = BilinearInfo(
        model=spec.name,
        layers=layers,
        query_heads=query_heads,
        kv_heads=kv_heads,
        head_dim=dim,
        rank=cfg.bilinear.rank,
        per_layer=bool(cfg.bilinear.per_layer),
        train={
            "config": OmegaConf.to_container(cfg, resolve=True),
            "history": history,
            "held_out": evaluation,
            "parameters": sum(p.numel() for p in head.parameters()),
            "extract_s": extract_s,
            "train_s": train_s,
        },
    )
    save_bilinear(head, cfg.output, info)
    log.info("saved %s (training %.1fs)", cfg.output, train_s)
    return {"checkpoint": cfg.output, "history": history, "final": history[-1], "held_out": evaluation}
