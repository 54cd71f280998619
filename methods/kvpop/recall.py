"""Fig. 7's measure: the share of the full-attention teacher's top-k that the policy keeps (KVpop, Sec. 4.3).

While a sequence decodes, each query's dense attention over every token seen so far (a shadow
copy of the keys, evicted ones included) adds to the future-attention mass of the tokens at
least ``w`` positions behind it (Eq. 2); at the end that mass is the teacher's target (Eq. 3).
At query positions after saturation the teacher's top-k under the decay the scorer learned is
compared with the policy's, per layer and KV head. Our reading of "the full-attention teacher":
the oracle of the decoding pass itself, whose keys are those of the model under eviction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from methods.kvpop.ranking import candidates, decayed, retention_recall, static_priority


def target_from_mass(mass: Tensor, window: int, eps: float) -> tuple[Tensor, Tensor]:
    """Eq. 3 from per-query-head masses ``(..., G, S)``: ``log(eps + max_g mass / N_t)`` and its validity.

    ``N_t = S - t - w`` queries see token ``t`` after it left the window (count normalisation, App. B.2);
    tokens no query sees that late (``N_t = 0``) get no target.
    """
    length = mass.shape[-1]
    counts = (length - window - torch.arange(length, device=mass.device)).clamp_min(0)
    valid = counts > 0
    target = (eps + mass.amax(-2) / counts.clamp_min(1)).log()
    return target.masked_fill(~valid, math.log(eps)), valid


class TeacherRecall:
    """Future-attention mass per layer, KV head and query head, accumulated over one sequence.

    Parameters:
        window: ``w``; a query ``d`` counts for tokens ``t <= d - w``.
        eps: floor inside the log of the target.
        block: query rows per block of the prompt's attention.
    """

    def __init__(self, window: int, eps: float = 1e-6, block: int = 256) -> None:
        self.window, self.eps, self.block = window, eps, block
        self.keys: dict[int, Tensor] = {}
        self.mass: dict[int, Tensor] = {}

    def _grow(self, layer: int, new_keys: Tensor, group: int) -> None:
        keys = self.keys.get(layer)
        self.keys[layer] = new_keys if keys is None else torch.cat([keys, new_keys], dim=1)
        total = self.keys[layer].shape[1]
        mass = self.mass.get(layer)
        grown = new_keys.new_zeros(new_keys.shape[0], group, total, dtype=torch.float32)
        if mass is not None:
            grown[..., : mass.shape[-1]] = mass
        self.mass[layer] = grown

    def seen(self, layer: int) -> int:
        return 0 if layer not in self.keys else self.keys[layer].shape[1]

    def observe(self, layer: int, queries: Tensor, new_keys: Tensor, scaling: float) -> None:
        """Add the attention of ``queries (H, Q, D)``, the newest ``Q`` positions, over every token so far.

        ``new_keys (Hkv, n, D)`` are the keys not seen before (the prompt's at the prefill, then one per step).
        """
        kv_heads = new_keys.shape[0]
        group = queries.shape[0] // kv_heads
        self._grow(layer, new_keys, group)
        keys, mass = self.keys[layer].float(), self.mass[layer]
        total = keys.shape[1]
        grouped = queries.float().view(kv_heads, group, queries.shape[1], -1)
        first = total - queries.shape[1]
        index = torch.arange(total, device=keys.device)
        for start in range(0, queries.shape[1], self.block):
            rows = grouped[:, :, start : start + self.block]
            positions = first + start + torch.arange(rows.shape[2], device=keys.device)
            logits = (rows @ keys.transpose(-1, -2)[:, None]) * scaling
            attention = logits.masked_fill(index[None, :] > positions[:, None], -torch.inf).softmax(-1)
            late = index[None, :] <= positions[:, None] - self.window
            mass += attention.masked_fill(~late, 0.0).sum(-2)

    def recall(
        self, bases: list[Tensor], log_gamma: Tensor, sinks: int, k: int, bucket: int, first: int, count: int
    ) -> Tensor:
        """``(layers, kv_heads)`` mean recall at ``count`` query positions spread over ``[first, S - 1]``.

        ``bases[layer]`` ``(kv_heads, S)``: the policy's static priority bases; ``log_gamma`` ``(layers, kv_heads)``.
        """
        length = self.seen(0)
        queries = torch.linspace(first, length - 1, count).round().long().unique()
        out = []
        for layer in sorted(self.keys):
            target, _ = target_from_mass(self.mass[layer], self.window, self.eps)
            gamma = log_gamma[layer].to(target)
            teacher = decayed(target, queries, gamma, bucket)
            positions = torch.arange(length)
            student = torch.stack(
                [static_priority(bases[layer].float(), positions, int(q), gamma[:, None], bucket) for q in queries], 1
            )
            mask = candidates(queries, length, sinks, self.window).expand_as(teacher)
            out.append(retention_recall(student, teacher, mask, k).mean(-1))
        return torch.stack(out)
