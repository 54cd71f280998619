"""The interface between the decoding engine and an eviction method.

A method sees tensors only: the attention of the current query (a by-product of the
attention the model computes anyway), keys, values and the absolute positions of the cached
entries. It answers with what to keep. It knows nothing of tasks or of transformers, so the
same object drives a real model (``harness.engine``) and the synthetic dialog world.

Call order for one sequence::

    begin(info)
    prefill forward  -> observe_prefill(view) per layer, if wants_prefill_queries
    keep(step=0, positions)                  # prefill-time methods evict here
    for step t = 1, 2, ...:                  # one query per forward
        forward      -> observe(view) per layer, if observes(t)
                        logit_bias(layer, positions) per layer
        keep(step=t, positions)              # decode-time methods evict here
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SequenceInfo:
    """What a method may know about the sequence it is about to serve.

    Parameters:
        prefill_len: L0, the prompt length.
        num_layers, num_kv_heads, num_query_heads: attention geometry (GQA when they differ).
        max_new_tokens: upper bound on generated tokens.
        seed: per-sequence seed for stochastic methods.
        device: where the cache lives.
    """

    prefill_len: int
    num_layers: int
    num_kv_heads: int
    num_query_heads: int
    max_new_tokens: int
    seed: int = 0
    device: torch.device = torch.device("cpu")


@dataclass
class LayerView:
    """One attention layer at one step, as the method sees it.

    Parameters:
        layer: layer index.
        keys, values: cached entries, ``(kv_heads, T, head_dim)``, keys after RoPE.
        positions: absolute position of every cached entry, ``(kv_heads, T)``.
        weights: softmax attention of the current query, ``(kv_heads, group, T)``, where
            ``group`` is the number of query heads sharing one KV head; ``None`` when the
            scorer asked for no attention.
        queries: query rows after RoPE, ``(query_heads, Q, head_dim)``: the trailing prompt
            queries at the prefill, the current query (Q = 1) at a decode step.
        scaling: the softmax temperature the model uses (``1/sqrt(head_dim)`` usually).
    """

    layer: int
    keys: Tensor
    values: Tensor
    positions: Tensor
    weights: Tensor | None = None
    queries: Tensor | None = None
    scaling: float = 1.0


#: Per layer, indices into that layer's cached entries to keep: ``(T',)`` for a set shared
#: by all KV heads, or ``(kv_heads, T')`` for a per-head set (same count for every head).
KeepPlan = list[Tensor]


class EvictionMethod(ABC):
    """Base class: a method that keeps everything. Subclasses override what they need."""

    name: str = "method"

    def begin(self, info: SequenceInfo) -> None:
        """Start a new sequence: drop all state from the previous one."""
        self.info = info

    @property
    def wants_prefill_queries(self) -> int:
        """How many trailing prompt queries ``observe_prefill`` needs (0: not called)."""
        return 0

    def observes(self, step: int) -> bool:
        """Whether ``observe`` runs at decode step ``step`` (1-based)."""
        return False

    def needs_attention(self, step: int) -> bool:
        """Whether ``observe`` at ``step`` needs the attention weights."""
        return False

    def observe_prefill(self, view: LayerView) -> None:
        """See one layer of the prefill (``view.queries`` holds the trailing queries)."""

    def observe(self, view: LayerView) -> None:
        """See one layer of a decode step."""

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        """Additive attention-logit bias ``(kv_heads, T)`` for this layer, or None."""
        return None

    @abstractmethod
    def budget(self) -> int | None:
        """Cache entries kept per layer and KV head for the current sequence (None: no limit)."""

    @abstractmethod
    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        """After the prefill (step 0) or decode step ``step``: what to keep, or None for all.

        ``positions[layer]`` is ``(kv_heads, T)``, the absolute positions now cached.
        """
