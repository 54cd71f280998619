"""Run a cache policy (an eviction method, as the harness adapts it) through a batch of dialogs.

The world is one layer with one attention head. The first turn is the prompt. With
``step="turn"`` (the paper's Algorithm 1, which runs once per turn on the turn's queries and
new keys) every later turn joins the cache at once: the policy's logit bias enters the head's
logits, the policy sees the causal softmax of the turn's queries over the cache and the
queries themselves, and keeps what it keeps. With ``step="token"`` (the earlier reading) every
token is one such step, as in decoding (``tasks.dialogs.policy``).

Metrics are taken at every turn end, after the turn's eviction (``measure="after_eviction"``)
or, with whole-turn steps, on the cache the turn's tokens have just joined, before the
policy's keep (``"before_eviction"``).

A topic is present in the cache (diversity: "at least one representative token") when a cached
token's label is the topic, its turn's dominant one (``diversity="labels"``, the first reading),
or when a cached token's cosine to the topic is above the retention threshold, the test the
paper's retention uses (``"cosine"``). The two agree while the noise is small (std 0.05: a token's
cosine to its own topic is about 0.89, to another about 0), except on Gradual's blended turns,
which are near both topics; with 0.05 read as the variance, a token's cosine to a topic it is
not on has a std of about 0.11, so some of the 56 cached tokens pass 0.3 for absent topics.

Batching: ``n`` dialogs run side by side as ``n`` rows of one layer (group 1);
``tests/test_dialogs.py`` checks that a batch reproduces the per-dialog one-head runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.world import Dialogs, Projections

STEPS = ("turn", "token")
MEASURES = ("after_eviction", "before_eviction")
DIVERSITIES = ("labels", "cosine")


@dataclass
class Trace:
    """Per dialog and turn, plus timings.

    Parameters:
        alignment: cosine between the head's output for the turn's mean query (over the
            cache, with the method's logit bias) and the ``W_V``-projected turn direction.
        retention: share of cached tokens with ``cos(x, d) > retention_threshold``.
        diversity: share of the dialog's topics with at least one cached token on it (by label or cosine).
        topic_retention: ``(n, n_turns, n_topics)`` share of cached tokens with
            ``cos(x, topic) > retention_threshold``, per topic.
        probes: per-turn values of what the method reports (``CachePolicy.probes``), ``(n, n_turns)``.
        cache_len: cached entries when measured.
        max_step_cache_len: largest cache length after any step's eviction.
        method_s: seconds spent inside the method (begin, observe, bias, keep).
        total_s: seconds of the whole simulation.
    """

    alignment: Tensor
    retention: Tensor
    diversity: Tensor
    topic_retention: Tensor
    cache_len: Tensor
    max_step_cache_len: int
    method_s: float
    total_s: float
    probes: dict[str, Tensor] = field(default_factory=dict)


def simulate(
    policy: CachePolicy,
    dialogs: Dialogs,
    heads: Projections,
    budget: int,
    retention_threshold: float = 0.3,
    seed: int = 0,
    step: str = "turn",
    measure: str = "after_eviction",
    diversity_by: str = "labels",
) -> Trace:
    """Run ``policy`` over ``dialogs`` (as rows of one layer) with ``budget`` entries and measure every turn."""
    start_all = time.perf_counter()
    n, length, dim = dialogs.x.shape
    n_turns, n_topics = dialogs.scenario.n_turns, dialogs.scenario.n_topics
    per_turn = length // n_turns
    x = dialogs.x
    head_dim = heads.w_q.shape[1]
    projected = x @ torch.cat([heads.w_q, heads.w_k, heads.w_v], dim=1)
    queries = projected[..., :head_dim]
    # Keys and values are read from the dialog's token table at the cached positions: one
    # indexing per step stands for the engine's append and physical gather.
    table = projected[..., head_dim:].reshape(n * length, 2 * head_dim)
    tokens = x.reshape(n * length, dim)
    directions = dialogs.directions.float()
    targets = torch.nn.functional.normalize(directions @ heads.w_v, dim=-1)
    scaling = heads.scaling
    # Whether each token is on every turn's direction and on every topic (cosine above the
    # threshold), once: row t < n_turns for turn t's direction, then one row per topic; a
    # turn's metrics read the cached positions' entries.
    axes = torch.cat([directions, torch.nn.functional.normalize(dialogs.topics.float(), dim=-1)], dim=1)
    cosines = torch.einsum("nld,nad->anl", x, axes) / x.norm(dim=-1).clamp_min(1e-12)
    marks = (cosines > retention_threshold).float().reshape(n_turns + n_topics, n * length)
    labels_flat = dialogs.labels.reshape(-1)
    alignment, retention, diversity = (torch.zeros(n, n_turns) for _ in range(3))
    topic_retention = torch.zeros(n, n_turns, n_topics)
    probes: dict[str, Tensor] = {}
    cache_len = torch.zeros(n_turns, dtype=torch.long)
    base = (torch.arange(n) * length)[:, None]

    def cached() -> tuple[Tensor, Tensor, Tensor]:
        flat = (policy.positions + base).reshape(-1)
        keys, values = table.index_select(0, flat).view(n, -1, 2 * head_dim).split(head_dim, dim=-1)
        return keys, values, tokens.index_select(0, flat).view(n, -1, dim)

    def measure_turn(turn: int) -> None:
        flat = (policy.positions + base).reshape(-1)
        retention[:, turn] = marks[turn].index_select(0, flat).view(n, -1).mean(dim=1)
        topic_retention[:, turn] = marks[n_turns:].index_select(1, flat).view(n_topics, n, -1).mean(dim=2).T
        if diversity_by == "cosine":
            present = topic_retention[:, turn] > 0
        else:
            labels = labels_flat.index_select(0, flat).view(n, -1)
            present = torch.zeros(n, n_topics).scatter_(1, labels, 1.0) > 0
        diversity[:, turn] = present.float().mean(dim=1)
        keys, values = table.index_select(0, flat).view(n, -1, 2 * head_dim).split(head_dim, dim=-1)
        probe = queries[:, turn * per_turn : (turn + 1) * per_turn].mean(dim=1)
        logits = torch.bmm(keys, probe[:, :, None])[..., 0] * scaling
        bias = policy.bias()
        if bias is not None:
            logits = logits + bias
        output = torch.bmm(torch.softmax(logits, dim=-1)[:, None, :], values)[:, 0]
        alignment[:, turn] = torch.nn.functional.cosine_similarity(output, targets[:, turn], dim=-1)
        cache_len[turn] = policy.positions.shape[1]

    def record_probes(turn: int) -> None:
        for name, value in policy.probes().items():
            probes.setdefault(name, torch.full((n, n_turns), float("nan")))[:, turn] = value

    policy.start(n, per_turn, length - per_turn, budget, seed)
    keys, values, embeddings = cached()
    policy.prefill(keys, values, queries[:, :per_turn], scaling, embeddings)
    measure_turn(0)
    record_probes(0)
    size = per_turn if step == "turn" else 1
    max_step = 0
    for start in range(per_turn, length, size):
        policy.next_step(size)
        keys, values, embeddings = cached()
        turn_end = (start + size) % per_turn == 0
        if turn_end and measure == "before_eviction":
            measure_turn((start + size) // per_turn - 1)
        step_queries = queries[:, start : start + size]
        weights = None
        if policy.wants_weights():
            logits = torch.bmm(step_queries, keys.transpose(1, 2)) * scaling
            bias = policy.bias()
            if bias is not None:
                logits = logits + bias[:, None, :]
            # A query sees the entries cached before it and the step's tokens up to itself.
            query_positions = torch.arange(start, start + size)
            future = policy.positions[:, None, :] > query_positions[None, :, None]
            weights = torch.softmax(logits.masked_fill(future, -torch.inf), dim=-1)
        policy.step(keys, values, weights, step_queries, scaling, embeddings)
        max_step = max(max_step, policy.positions.shape[1])
        if turn_end:
            turn = (start + size) // per_turn - 1
            if measure == "after_eviction":
                measure_turn(turn)
            record_probes(turn)
    return Trace(
        alignment=alignment,
        retention=retention,
        diversity=diversity,
        topic_retention=topic_retention,
        cache_len=cache_len,
        max_step_cache_len=max_step,
        method_s=policy.method_s,
        total_s=time.perf_counter() - start_all,
        probes=probes,
    )


def adaptation(retention: Tensor, shifts: list[int], threshold: float = 0.8) -> tuple[Tensor, Tensor]:
    """Turns until retention reaches ``threshold`` after each shift, and whether it never did.

    For a shift at turn ``s`` (the first turn of the new topic), the speed is ``k + 1`` for
    the first ``k >= 0`` with ``retention[s + k] >= threshold`` (1: adapted by the end of the
    shift turn itself). Never reaching it counts as the remaining turns ``n_turns - s``
    (16 in the ``adaptation`` dialog: the paper's "H2O never adapts within 16 turns").
    Returns ``(speed, never)``, each ``(n, len(shifts))``.
    """
    n, n_turns = retention.shape
    if not shifts:
        return torch.zeros(n, 0), torch.zeros(n, 0, dtype=torch.bool)
    speeds, nevers = [], []
    for shift in shifts:
        reached = retention[:, shift:] >= threshold
        never = ~reached.any(dim=1)
        first = reached.float().argmax(dim=1) + 1
        speeds.append(torch.where(never, torch.full_like(first, n_turns - shift), first))
        nevers.append(never)
    return torch.stack(speeds, dim=1).float(), torch.stack(nevers, dim=1)
