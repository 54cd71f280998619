"""Drive an eviction method through a batch of dialogs, the way ``harness.engine`` drives a model.

The world is one layer with one attention head. The first turn is the prompt (prefill,
``keep(0)``); every later token is one decode step: its position is appended to the cache,
the method's ``logit_bias`` enters the head's logits, the method observes the step (the
softmax weights of the token's own query, and the query itself in ``LayerView.queries``),
then ``keep(step)`` and a physical gather, exactly the engine's call order.

Batching: ``n`` dialogs run side by side as ``n`` KV heads of one layer (group 1). This is
the one-head world only for methods whose state and keep set are per KV head, so the task
sets ``granularity="head"`` on methods that have a ``Selection`` (in a one-layer one-head
world token, layer and head granularity coincide); ``tests/test_dialogs.py`` checks that a
batch reproduces the per-dialog one-head runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from methods.base import EvictionMethod, LayerView, SequenceInfo
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


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """Rows of a ``(n, T, ...)`` tensor, index ``(T',)`` shared or ``(n, T')`` per dialog."""
    if index.dim() == 1:
        return tensor[:, index]
    if tensor.dim() == 2:
        return tensor.gather(1, index)
    return tensor.gather(1, index[..., None].expand(-1, -1, tensor.shape[-1]))


def simulate(
    method: EvictionMethod,
    dialogs: Dialogs,
    heads: Projections,
    retention_threshold: float = 0.3,
    seed: int = 0,
) -> Trace:
    """Run ``method`` over ``dialogs`` (as KV heads of one layer) and measure every turn."""
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

    info = SequenceInfo(
        prefill_len=per_turn,
        num_layers=1,
        num_kv_heads=n,
        num_query_heads=n,
        max_new_tokens=length - per_turn,
        seed=seed,
    )
    positions = torch.arange(per_turn).expand(n, -1)
    # Keys and values are read from the dialog's token table at the cached positions: one
    # indexing per step stands for the engine's append and physical gather.
    head_dim = keys_all.shape[-1]
    table = torch.cat([keys_all, values_all], dim=-1).reshape(n * length, 2 * head_dim)
    base = (torch.arange(n) * length)[:, None]

    def cached() -> tuple[Tensor, Tensor]:
        rows = table.index_select(0, (positions + base).reshape(-1)).view(n, -1, 2 * head_dim)
        return rows[..., :head_dim], rows[..., head_dim:]

    keys, values = cached()
    clock = time.perf_counter()
    method.begin(info)
    wanted = method.wants_prefill_queries
    if wanted:
        first = max(per_turn - wanted, 0)
        method.observe_prefill(
            LayerView(0, keys, values, positions, queries=queries[:, first:per_turn, :], scaling=scaling)
        )
    plan = method.keep(0, [positions])
    method_s = time.perf_counter() - clock

    def apply(plan: list[Tensor] | None) -> None:
        nonlocal positions
        if plan is not None:
            positions = _gather(positions, plan[0])

    def measure(turn: int) -> None:
        keys, values = cached()
        flat = (positions + base).reshape(-1)
        cached_x = x.reshape(n * length, -1).index_select(0, flat).view(n, -1, x.shape[-1])
        direction = directions[:, turn]
        cosine = torch.nn.functional.cosine_similarity(cached_x, direction[:, None, :], dim=-1)
        retention[:, turn] = (cosine > retention_threshold).float().mean(dim=1)
        labels = dialogs.labels.reshape(-1).index_select(0, flat).view(n, -1)
        present = torch.zeros(n, n_topics).scatter_(1, labels, 1.0)
        diversity[:, turn] = present.mean(dim=1)
        probe = queries[:, turn * per_turn : (turn + 1) * per_turn].mean(dim=1)
        logits = torch.einsum("nd,ntd->nt", probe, keys) * scaling
        bias = method.logit_bias(0, positions)
        if bias is not None:
            logits = logits + bias
        output = torch.einsum("nt,ntd->nd", torch.softmax(logits, dim=-1), values)
        alignment[:, turn] = torch.nn.functional.cosine_similarity(output, targets[:, turn], dim=-1)
        cache_len[turn] = positions.shape[1]

    apply(plan)
    measure(0)
    max_step = 0
    for step in range(1, length - per_turn + 1):
        position = per_turn + step - 1
        positions = torch.cat([positions, torch.full((n, 1), position)], dim=1)
        keys, values = cached()
        clock = time.perf_counter()
        observe, wants = method.observes(step), method.needs_attention(step)
        bias = method.logit_bias(0, positions)
        weights = None
        if wants or bias is not None:
            query = queries[:, position]
            logits = torch.einsum("nd,ntd->nt", query, keys) * scaling
            if bias is not None:
                logits = logits + bias
            weights = torch.softmax(logits, dim=-1)[:, None, :]
        if observe:
            method.observe(
                LayerView(
                    0,
                    keys,
                    values,
                    positions,
                    weights=weights if wants else None,
                    queries=queries[:, position : position + 1, :],
                    scaling=scaling,
                )
            )
        plan = method.keep(step, [positions])
        method_s += time.perf_counter() - clock
        apply(plan)
        max_step = max(max_step, positions.shape[1])
        if (position + 1) % per_turn == 0:
            measure((position + 1) // per_turn - 1)
    return Trace(
        alignment=alignment,
        retention=retention,
        diversity=diversity,
        cache_len=cache_len,
        max_step_cache_len=max_step,
        method_s=method_s,
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
