"""Run a cache policy (an eviction method, as the harness adapts it) through a batch of dialogs.

The world is one layer with one attention head. The first turn is the prompt; every later
token is one decode step: it joins the cache, the policy's logit bias enters the head's
logits, the policy sees the step (the softmax weights of the token's own query, and the query
itself) and keeps what it keeps (``tasks.dialogs.policy``).

Batching: ``n`` dialogs run side by side as ``n`` rows of one layer (group 1);
``tests/test_dialogs.py`` checks that a batch reproduces the per-dialog one-head runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.world import Dialogs, Projections


@dataclass
class Trace:
    """Per dialog and turn (measured after the turn's last eviction), plus timings.

    Parameters:
        alignment: cosine between the head's output for the turn's mean query (over the
            cache, with the method's logit bias) and ``W_V``-projected turn direction.
        retention: share of cached tokens with ``cos(x, d) > retention_threshold``.
        diversity: share of the dialog's topics with at least one cached token.
        cache_len: cached entries after the turn.
        max_step_cache_len: largest cache length after any decode step's eviction.
        method_s: seconds spent inside the method (begin, observe, bias, keep).
        total_s: seconds of the whole simulation.
    """

    alignment: Tensor
    retention: Tensor
    diversity: Tensor
    cache_len: Tensor
    max_step_cache_len: int
    method_s: float
    total_s: float


def simulate(
    policy: CachePolicy,
    dialogs: Dialogs,
    heads: Projections,
    budget: int,
    retention_threshold: float = 0.3,
    seed: int = 0,
) -> Trace:
    """Run ``policy`` over ``dialogs`` (as rows of one layer) with ``budget`` entries and measure every turn."""
    start_all = time.perf_counter()
    n, length, _ = dialogs.x.shape
    per_turn = length // dialogs.scenario.n_turns
    x = dialogs.x
    queries, keys_all, values_all = x @ heads.w_q, x @ heads.w_k, x @ heads.w_v
    directions = dialogs.directions.float()
    targets = torch.nn.functional.normalize(directions @ heads.w_v, dim=-1)
    n_topics = dialogs.scenario.n_topics
    scaling = heads.scaling
    n_turns = dialogs.scenario.n_turns
    alignment = torch.zeros(n, n_turns)
    retention = torch.zeros(n, n_turns)
    diversity = torch.zeros(n, n_turns)
    cache_len = torch.zeros(n_turns, dtype=torch.long)
    # Keys and values are read from the dialog's token table at the cached positions: one
    # indexing per step stands for the engine's append and physical gather.
    head_dim = keys_all.shape[-1]
    table = torch.cat([keys_all, values_all], dim=-1).reshape(n * length, 2 * head_dim)
    base = (torch.arange(n) * length)[:, None]

    def cached() -> tuple[Tensor, Tensor]:
        rows = table.index_select(0, (policy.positions + base).reshape(-1)).view(n, -1, 2 * head_dim)
        return rows[..., :head_dim], rows[..., head_dim:]

    def measure(turn: int) -> None:
        keys, values = cached()
        flat = (policy.positions + base).reshape(-1)
        cached_x = x.reshape(n * length, -1).index_select(0, flat).view(n, -1, x.shape[-1])
        direction = directions[:, turn]
        cosine = torch.nn.functional.cosine_similarity(cached_x, direction[:, None, :], dim=-1)
        retention[:, turn] = (cosine > retention_threshold).float().mean(dim=1)
        labels = dialogs.labels.reshape(-1).index_select(0, flat).view(n, -1)
        present = torch.zeros(n, n_topics).scatter_(1, labels, 1.0)
        diversity[:, turn] = present.mean(dim=1)
        probe = queries[:, turn * per_turn : (turn + 1) * per_turn].mean(dim=1)
        logits = torch.einsum("nd,ntd->nt", probe, keys) * scaling
        bias = policy.bias()
        if bias is not None:
            logits = logits + bias
        output = torch.einsum("nt,ntd->nd", torch.softmax(logits, dim=-1), values)
        alignment[:, turn] = torch.nn.functional.cosine_similarity(output, targets[:, turn], dim=-1)
        cache_len[turn] = policy.positions.shape[1]

    policy.start(n, per_turn, length - per_turn, budget, seed)
    keys, values = cached()
    policy.prefill(keys, values, queries[:, :per_turn], scaling)
    measure(0)
    max_step = 0
    for step in range(1, length - per_turn + 1):
        position = per_turn + step - 1
        policy.next_step()
        keys, values = cached()
        weights = None
        if policy.wants_weights():
            logits = torch.einsum("nd,ntd->nt", queries[:, position], keys) * scaling
            bias = policy.bias()
            if bias is not None:
                logits = logits + bias
            weights = torch.softmax(logits, dim=-1)[:, None, :]
        policy.step(keys, values, weights, queries[:, position : position + 1, :], scaling)
        max_step = max(max_step, policy.positions.shape[1])
        if (position + 1) % per_turn == 0:
            measure((position + 1) // per_turn - 1)
    return Trace(
        alignment=alignment,
        retention=retention,
        diversity=diversity,
        cache_len=cache_len,
        max_step_cache_len=max_step,
        method_s=policy.method_s,
        total_s=time.perf_counter() - start_all,
    )


def adaptation(retention: Tensor, shifts: list[int], threshold: float = 0.8) -> tuple[Tensor, Tensor]:
    """Turns until retention reaches ``threshold`` after each shift, and whether it never did.

    For a shift at turn ``s`` (the first turn of the new topic), the speed is ``k + 1`` for
    the first ``k >= 0`` with ``retention[s + k] >= threshold`` (1: adapted by the end of the
    shift turn itself). Never reaching it counts as the remaining turns ``n_turns - s``
    (the paper's "16 turns (never)" for H2O is 20 - 4 in the complex scenario).
    Returns ``(speed, never)``, each ``(n, len(shifts))``.
    """
    n, n_turns = retention.shape
    speeds, nevers = [], []
    for shift in shifts:
        reached = retention[:, shift:] >= threshold
        never = ~reached.any(dim=1)
        first = reached.float().argmax(dim=1) + 1
        speeds.append(torch.where(never, torch.full_like(first, n_turns - shift), first))
        nevers.append(never)
    if not shifts:
        return torch.zeros(n, 0), torch.zeros(n, 0, dtype=torch.bool)
    return torch.stack(speeds, dim=1).float(), torch.stack(nevers, dim=1)
