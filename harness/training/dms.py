"""DMS, the learned-gate baseline of KVpop's tables, trained in KVpop's pipeline (KVpop, arXiv 2607.05061, Sec. 4).

Dynamic Memory Sparsification (Łańcucki et al. 2025, "Inference-Time Hyper-Scaling with KV Cache
Compression") learns a binary eviction decision per token and KV head with a differentiable
relaxation and delays the eviction through a sliding window: a token marked at insertion stays
attendable until it leaves the ``w`` most recent tokens. Here, as KVpop trains it ("the same
budget as KVpop", "its parameter count matched to the KVpop scorers"): the gate is a KVpop-sized
MLP on the token's detached ``[k; v]`` giving a keep logit ``r_t``; in training the eviction
probability is the Gumbel-sigmoid ``alpha_t = sigmoid((-r_t + g_t) / tau)`` (``g_t`` logistic
noise) and every query past the window adds ``log(1 - alpha_t)`` to the token's attention logit,
so the KL distillation shapes the gates; a one-sided penalty ``max(0, alpha* - mean alpha)``
pushes the mean eviction rate to the rate the budget needs, ``alpha* = 1 - k / (S - s - w)``,
annealed linearly from 0 over ``anneal_steps``. Our readings where the KVpop paper is silent: the
temperature, the penalty weight and the schedule (``dms.*`` in ``conf/train_kvpop.yaml``),
and ``s`` sinks kept as in every row of the table. At inference (``methods.dms``) the keep logit
ranks the eligible tokens under the fixed budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from harness.decode.attention import AttentionCall
from harness.training.joint import Pattern
from harness.training.kvpop.pattern import save_policy
from harness.training.kvpop.sparse import attend_kept, attend_soft
from methods.finetuned import Finetune
from methods.kvpop.ranking import drop_times
from methods.kvpop.scorers import MLPScorer


class DMSPattern(Pattern):
    """Relaxed eviction gates in training; the gates' top-k under the budget at inference.

    Parameters:
        gate: an ``MLPScorer`` (its decay unused: ``gamma = 1``), the keep logit per token.
        sinks, window, k: the geometry of the budget ``B = s + w + k``.
        length: training window length ``S`` (for the target eviction rate).
        temperature: ``tau`` of the Gumbel-sigmoid.
        weight: weight of the eviction-rate penalty.
        anneal_steps: steps over which the target rate rises linearly from 0.
        attention: ``dense`` or ``flex``.
        generator: the noise.
    """

    def __init__(
        self,
        gate: MLPScorer,
        sinks: int,
        window: int,
        k: int,
        length: int,
        temperature: float,
        weight: float,
        anneal_steps: int,
        attention: str,
        generator: torch.Generator,
    ) -> None:
        self.gate, self.sinks, self.window, self.k = gate, sinks, window, k
        self.budget = self.first = sinks + window + k
        self.rate = 1.0 - k / max(length - sinks - window, 1)
        self.temperature, self.weight, self.anneal_steps = temperature, weight, anneal_steps
        self.attention, self.generator = attention, generator
        self.alphas: dict[int, Tensor] = {}

    def policy_parameters(self) -> list[nn.Parameter]:
        return list(self.gate.parameters())

    def attend(self, call: AttentionCall) -> Tensor:
        layer = call.layer
        keep = self.gate(call.key[0].detach(), call.value[0].detach(), layer)
        if not self.training:
            drop = drop_times(keep.detach().float(), self.sinks, self.window, self.k)
            return attend_kept(call, drop, self.sinks, self.window, self.attention)[0]
        uniform = torch.rand(keep.shape, generator=self.generator).clamp(1e-6, 1 - 1e-6).to(keep)
        noise = uniform.log() - (-uniform).log1p()
        evict = (-keep + noise) / self.temperature
        # log(1 - sigmoid(x)) = logsigmoid(-x), exact where alpha is close to 1.
        self.alphas[layer] = torch.sigmoid(evict)
        return attend_soft(call, F.logsigmoid(-evict), self.sinks, self.window, self.attention)

    def loss(self, step: int) -> tuple[Tensor | None, dict[str, float]]:
        length = next(iter(self.alphas.values())).shape[-1]
        # Tokens that leave the window within the training window are the ones a gate decides.
        decided = torch.stack([alpha[:, self.sinks : length - self.window] for alpha in self.alphas.values()])
        self.alphas.clear()
        target = self.rate * min(1.0, (step + 1) / max(self.anneal_steps, 1))
        rate = decided.mean()
        penalty = torch.relu(target - rate)
        return self.weight * penalty, {"evict_rate": rate.detach().item(), "evict_target": target}

    def finetune(self, model: str) -> Finetune:
        return Finetune("dms", model, self.sinks, self.window, self.budget)

    def save(self, folder: Path, base_model: Path, history: list[dict[str, float]], config: dict[str, Any]) -> Path:
        geometry = (self.sinks, self.window, self.k, self.budget)
        return save_policy(self.gate, folder, geometry, "dms", base_model, history, config)
