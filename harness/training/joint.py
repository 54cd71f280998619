"""Fine-tuning a base model under an eviction pattern with KL distillation: KVpop's recipe and its trained baselines.

KVpop (arXiv 2607.05061), Sec. 4 and Algorithm 1. Each step the frozen dense model (the teacher)
and the model under the pattern (the student) read one training window; the student's
next-token distributions are distilled from the teacher's, ``KL(teacher || student)`` averaged
over positions, and the pattern adds its own objective: KVpop's boundary loss for the scorer,
DMS's compression loss for its gates, nothing for StreamingLLM+. KVpop's scorer inputs are
detached, so its loss trains the scorer only and the KL the base model only (Sec. 3.3); DMS's
gates learn from the KL through the relaxed mask. The base model trains at a constant learning
rate, the policy with warmup and a cosine decay (Sec. 4: ``8e-5`` and ``1e-3``).

Held-out windows give the token accuracy of Fig. 5: the share of positions past the budget at
which the student under the pattern's inference rule predicts the next token.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import PreTrainedModel

from harness.decode.attention import AttentionCall, AttentionFunction
from methods.finetuned import Finetune

log = logging.getLogger(__name__)


class Pattern(ABC):
    """The eviction pattern a student trains under, and what it learns.

    Attributes:
        training: the relaxed training form (noise, soft masks) instead of the inference rule.
        budget: entries per KV head the pattern keeps at inference.
        first: the first query position at which the budget binds (token accuracy counts from there).
    """

    training: bool = True
    budget: int
    first: int

    @abstractmethod
    def attend(self, call: AttentionCall) -> Tensor:
        """One layer's attention under the pattern: the output ``(1, S, H, D)``."""

    def loss(self, step: int) -> tuple[Tensor | None, dict[str, float]]:
        """The pattern's own objective after the student's forward (None: none) and figures to log."""
        return None, {}

    def policy_parameters(self) -> list[nn.Parameter]:
        return []

    @abstractmethod
    def finetune(self, model: str) -> Finetune:
        """The record written beside the fine-tuned weights."""

    def save(
        self, folder: Path, base_model: Path, history: list[dict[str, float]], config: dict[str, Any]
    ) -> Path | None:
        """Save the policy (None: the pattern has no parameters)."""
        return None


TRAINING = AttentionFunction("evictbench_train", lambda pattern, call: (pattern.attend(call), None))


def distillation_kl(teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
    """``KL(teacher || student)`` of the next-token distributions, summed over the vocabulary, mean over positions."""
    teacher = teacher_logits.float().log_softmax(-1)
    student = student_logits.float().log_softmax(-1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def cosine_factor(step: int, steps: int, warmup: int, floor: float) -> float:
    """Linear warmup to 1, then cosine decay to ``floor`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def token_accuracy(model: PreTrainedModel, pattern: Pattern | None, windows: list[list[int]], first: int) -> float:
    """Share of positions ``>= first`` where the argmax of ``model`` (under ``pattern``'s inference rule,
    dense when None) is the next token of the window."""
    hits = total = 0
    for ids in windows:
        batch = torch.tensor([ids], device=model.device)
        if pattern is None:
            logits = model(input_ids=batch, use_cache=False).logits[0]
        else:
            training, pattern.training = pattern.training, False
            with TRAINING.active(pattern, model):
                logits = model(input_ids=batch, use_cache=False).logits[0]
            pattern.training = training
        predicted = logits[first - 1 : -1].argmax(-1)
        hits += int((predicted == batch[0, first:]).sum())
        total += predicted.numel()
    return hits / max(total, 1)


@dataclass
class Schedule:
    """Optimisation settings of the joint recipe (``train.*`` in ``conf/train_kvpop.yaml``)."""

    steps: int
    lr: float
    base_lr: float
    warmup: int
    min_lr_ratio: float
    weight_decay: float
    clip: float
    distill_weight: float
    eval_every: int
    log_every: int
    cache_teacher: bool = False


def fine_tune(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    pattern: Pattern,
    windows: list[list[int]],
    heldout: list[list[int]],
    schedule: Schedule,
) -> list[dict[str, float]]:
    """Train ``student`` and the pattern's policy; returns the history (loss, KL, token accuracy per point)."""
    base = [p for p in student.parameters() if p.requires_grad] if schedule.base_lr > 0 else []
    if not base:
        student.requires_grad_(False)
    groups = [{"params": base, "lr": schedule.base_lr}] if base else []
    policy = pattern.policy_parameters()
    if policy:
        groups.append({"params": policy, "lr": schedule.lr, "weight_decay": schedule.weight_decay})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    # The base model keeps a constant rate; the policy's follows warmup + cosine.
    factors = [lambda _step: 1.0] * bool(base) + [
        lambda step: cosine_factor(step, schedule.steps, schedule.warmup, schedule.min_lr_ratio)
    ] * bool(policy)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
    history: list[dict[str, float]] = []
    running: dict[str, list[float]] = {}
    start = time.perf_counter()

    def evaluate(step: int) -> None:
        student.eval()
        point = {"step": step, "token_accuracy": token_accuracy(student, pattern, heldout, pattern.first)}
        point |= {name: sum(values) / len(values) for name, values in running.items()}
        point["seconds"] = time.perf_counter() - start
        history.append(point)
        running.clear()
        log.info("step %d %s", step, " ".join(f"{k} {v:.4g}" for k, v in point.items() if k != "step"))
        student.train()

    # The frozen teacher's logits of a window never change: with cache_teacher, computed once per window.
    references: dict[int, Tensor] = {}
    evaluate(0)
    for step in range(schedule.steps):
        index = step % len(windows)
        batch = torch.tensor([windows[index]], device=student.device)
        reference = references.get(index)
        if reference is None:
            with torch.no_grad():
                reference = teacher(input_ids=batch, use_cache=False).logits[0]
            if schedule.cache_teacher:
                references[index] = reference
        with TRAINING.active(pattern, student):
            logits = student(input_ids=batch, use_cache=False).logits[0]
        kl = distillation_kl(reference, logits)
        extra, figures = pattern.loss(step)
        total = schedule.distill_weight * kl + (extra if extra is not None else 0.0)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        for group in groups:  # the base model's and the policy's gradients differ in scale by orders
            torch.nn.utils.clip_grad_norm_(group["params"], schedule.clip)
        optimizer.step()
        scheduler.step()
        for name, value in {"loss": total.detach().item(), "kl": kl.detach().item(), **figures}.items():
            running.setdefault(name, []).append(value)
        if (step + 1) % schedule.eval_every == 0 or step + 1 == schedule.steps:
            evaluate(step + 1)
    student.eval()
    return history
