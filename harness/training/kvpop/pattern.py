"""KVpop's pattern in the joint recipe, and StreamingLLM+'s (KVpop, arXiv 2607.05061, Algorithm 1 and Sec. 4).

KVpop: in every layer the scorer scores the detached ``[k; v]`` of the whole window; their static
priorities give the running top-k pattern the layer attends under (``sparse.attend_kept``), and
the layer's queries and keys give the future-attention target (Eq. 8, with the pattern's own
log-normalisers, Eq. 9). After the forward the boundary loss (Eq. 7) at sampled query positions
trains the scorer, its decay included. StreamingLLM+ attends under sinks + the most recent
tokens of the same budget and learns nothing but the base model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from harness.decode.attention import AttentionCall
from harness.training.joint import Pattern
from harness.training.kvpop.loss import Weighting, boundary_loss, sample_queries
from harness.training.kvpop.sparse import attend_kept, streaming_drop
from harness.training.kvpop.target import future_attention_target
from methods.finetuned import Finetune
from methods.kvpop.checkpoint import CheckpointInfo, save_checkpoint
from methods.kvpop.ranking import candidates, decayed, drop_times, retention_recall, static_base
from methods.kvpop.scorers import KVpopScorer

LSES = ("sparse", "dense")


def save_policy(
    scorer: KVpopScorer,
    folder: Path,
    geometry: tuple[int, int, int, int],
    objective: str,
    base_model: Path,
    history: list[dict[str, float]],
    config: dict[str, Any],
) -> Path:
    """``folder/policy.safetensors``: a policy trained with the base model fine-tuned in ``base_model``.

    ``geometry`` is ``(sinks, window, k, budget)``.
    """
    sinks, window, k, budget = geometry
    info = CheckpointInfo(
        model=config["model"]["name"],
        layers=scorer.layers,
        kv_heads=scorer.kv_heads,
        head_dim=scorer.head_dim,
        scorer=scorer.hyperparameters(),
        policy={"sinks": sinks, "window": window, "k": k, "bucket": 1, "budget": budget},
        train={"config": config, "history": history},
        objective=objective,
        base_model=str(base_model),
    )
    return save_checkpoint(scorer, folder / "policy.safetensors", info)


class KVpopPattern(Pattern):
    """The scorer's running top-k, trained by the boundary loss.

    Parameters:
        scorer: the scorer being trained.
        sinks, window, k: ``s``, ``w``, ``k`` (``B = s + w + k`` plus the state's share).
        budget: the memory budget per KV head it is trained for (recorded in the checkpoint).
        objective: ``train.*`` of the config: ``queries``, ``late_fraction``, ``late_power``,
            ``temperature``, ``boundary``, ``eps``, ``target_method``, ``target_lse``, ``score_weight``.
        weighting: Eq. 7's weights.
        attention: ``dense`` or ``flex`` (``sparse.resolve_attention``).
        generator: draws the query positions.
    """

    def __init__(
        self,
        scorer: KVpopScorer,
        sinks: int,
        window: int,
        k: int,
        budget: int,
        objective: Any,
        weighting: Weighting,
        attention: str,
        generator: torch.Generator,
    ) -> None:
        if objective.target_lse not in LSES:
            raise ValueError(
                f"train.target_lse={objective.target_lse!r} is not a normaliser — use sparse (Eq. 9) or dense (Eq. 8)"
            )
        self.scorer, self.sinks, self.window, self.k, self.budget = scorer, sinks, window, k, budget
        self.objective, self.weighting, self.attention, self.generator = objective, weighting, attention, generator
        self.first = sinks + window + k
        self.captured: dict[int, tuple[Tensor, ...]] = {}

    def policy_parameters(self) -> list[nn.Parameter]:
        return list(self.scorer.parameters())

    def attend(self, call: AttentionCall) -> Tensor:
        layer, length = call.layer, call.query.shape[2]
        keys, values = call.key[0].detach(), call.value[0].detach()
        scores = self.scorer(keys, values, layer)
        log_gamma = self.scorer.log_gamma()[layer].detach()
        positions = torch.arange(length, device=scores.device)
        priority = static_base(scores.detach().float(), positions, log_gamma[:, None], 1)
        drop = drop_times(priority, self.sinks, self.window, self.k)
        output, lse = attend_kept(call, drop, self.sinks, self.window, self.attention)
        if self.training:
            self.captured[layer] = (scores, call.query[0].detach(), keys, lse, call.scaling)
        return output

    def loss(self, step: int) -> tuple[Tensor | None, dict[str, float]]:
        objective = self.objective
        length = next(iter(self.captured.values()))[0].shape[-1]
        queries = sample_queries(
            length, self.first, objective.queries, objective.late_fraction, self.generator, objective.late_power
        )
        log_gamma = self.scorer.log_gamma()
        students, teachers = [], []
        for layer in sorted(self.captured):
            scores, q, keys, lse, scaling = self.captured[layer]
            with torch.no_grad():
                target, _ = future_attention_target(
                    q,
                    keys,
                    scaling,
                    self.window,
                    objective.eps,
                    objective.target_method,
                    lse=lse if objective.target_lse == "sparse" else None,
                )
            queries_here = queries.to(scores.device)
            teachers.append(decayed(target.to(scores), queries_here, log_gamma[layer].detach(), 1))
            students.append(decayed(scores, queries_here, log_gamma[layer], 1))
        self.captured.clear()
        student, teacher = torch.cat(students), torch.cat(teachers)
        mask = candidates(queries.to(student.device), length, self.sinks, self.window)
        loss = boundary_loss(
            student,
            teacher,
            mask,
            queries.to(student.device),
            self.window,
            self.k,
            objective.temperature,
            self.weighting,
            objective.boundary,
        )
        recall = retention_recall(student.detach(), teacher, mask.expand_as(teacher), self.k).mean()
        figures = {
            "score_loss": loss.detach().item(),
            "recall": recall.item(),
            "gamma": log_gamma.detach().exp().mean().item(),
        }
        return objective.score_weight * loss, figures

    def finetune(self, model: str) -> Finetune:
        return Finetune("kvpop", model, self.sinks, self.window, self.budget)

    def save(self, folder: Path, base_model: Path, history: list[dict[str, float]], config: dict[str, Any]) -> Path:
        geometry = (self.sinks, self.window, self.k, self.budget)
        return save_policy(self.scorer, folder, geometry, "kvpop", base_model, history, config)


class StreamingPattern(Pattern):
    """StreamingLLM+: sinks and the ``w + k + 1`` most recent tokens, the budget of the KVpop rows."""

    def __init__(self, sinks: int, window: int, k: int, attention: str) -> None:
        self.sinks, self.window, self.k, self.attention = sinks, window, k, attention
        self.budget = self.first = sinks + window + k

    def attend(self, call: AttentionCall) -> Tensor:
        length = call.query.shape[2]
        drop = streaming_drop(1, length, self.window, self.k, call.query.device)
        return attend_kept(call, drop, self.sinks, self.window, self.attention)[0]

    def finetune(self, model: str) -> Finetune:
        # At inference StreamingLLM keeps the sinks and the B - s most recent entries as its window.
        return Finetune("streaming", model, self.sinks, self.window + self.k, self.budget)
