"""The learned bilinear scorer of InertiaKV (§5.1, Fig. 2a, App. J): ``score(q, k) = (W_k k)^T (W_q q) / sqrt(r)``.

``q`` is the current query of every query head concatenated (``H * head_dim``), ``k`` an entry's
keys of every KV head concatenated (``Hkv * head_dim``), ``r = 64``: on Llama-3.1-8B that is the
paper's 327,680 parameters (64 x 4096 + 64 x 1024), one head shared by all layers (the reading
of "a 327,680-parameter bilinear head"; ``per_layer`` in training gives each layer its own).
The score of an entry is the softmax of those logits over the cached entries, the distribution
the head was trained to match (``harness.training.bilinear``: self-distillation against the
model's attention, MSE + 0.1 KL at temperature 1), and is the same for every KV head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from methods.base import LayerView, SequenceInfo
from methods.checkpoint import read_checkpoint, write_checkpoint
from methods.scorers.base import Scorer

METADATA_KEY = "bilinear"
TRAIN = "train one with python -m harness.training.bilinear model=<model> and pass method.scorer.checkpoint=<path>"


class BilinearHead(nn.Module):
    """``(W_k k)^T (W_q q) / sqrt(rank)`` with one ``(W_q, W_k)`` pair per layer, or one for all (``sets=1``)."""

    def __init__(self, sets: int, query_dim: int, key_dim: int, rank: int = 64) -> None:
        super().__init__()
        self.rank = rank
        self.query = nn.Parameter(torch.randn(sets, rank, query_dim) / math.sqrt(query_dim))
        self.key = nn.Parameter(torch.randn(sets, rank, key_dim) / math.sqrt(key_dim))

    def logits(self, queries: Tensor, keys: Tensor, layer: int) -> Tensor:
        """``(Q, T)`` logits of ``(Q, query_dim)`` queries over ``(T, key_dim)`` keys at ``layer``."""
        index = layer if self.query.shape[0] > 1 else 0
        projected_queries = queries @ self.query[index].T
        projected_keys = keys @ self.key[index].T
        return projected_queries @ projected_keys.T / math.sqrt(self.rank)


def flat_queries(queries: Tensor) -> Tensor:
    """``(H, Q, D)`` per-head queries as ``(Q, H * D)``."""
    return queries.transpose(0, 1).reshape(queries.shape[1], -1)


def flat_keys(keys: Tensor) -> Tensor:
    """``(Hkv, T, D)`` per-head keys as ``(T, Hkv * D)``."""
    return keys.transpose(0, 1).reshape(keys.shape[1], -1)


@dataclass
class BilinearInfo:
    """What a bilinear checkpoint was trained for: the model, its attention geometry, the head's shape."""

    model: str
    layers: int
    query_heads: int
    kv_heads: int
    head_dim: int
    rank: int
    per_layer: bool
    train: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return (
            f"{self.model} ({self.layers} layers, {self.query_heads} query / {self.kv_heads} KV heads, "
            f"head_dim {self.head_dim})"
        )


def save_bilinear(head: BilinearHead, path: str, info: BilinearInfo) -> None:
    write_checkpoint(dict(head.state_dict()), path, METADATA_KEY, info.__dict__)


def load_bilinear(path: str, train: str = TRAIN) -> tuple[BilinearHead, BilinearInfo]:
    """The head stored at ``path`` (eval mode, CPU) and what it was trained for; ``train`` is the fix to print."""
    tensors, meta = read_checkpoint(path, METADATA_KEY, train)
    try:
        info = BilinearInfo(**meta)
        head = BilinearHead(
            info.layers if info.per_layer else 1,
            info.query_heads * info.head_dim,
            info.kv_heads * info.head_dim,
            info.rank,
        )
        head.load_state_dict(tensors)
    except (TypeError, RuntimeError) as error:
        raise ValueError(
            f"{path}: its tensors or metadata are not a bilinear head's ({error!r:.80}) — {train}"
        ) from None
    return head.eval(), info


@dataclass
class BilinearScorer(Scorer):
    """The trained bilinear head's softmax over the cached entries, for the current query.

    Parameters:
        checkpoint: a head written by ``python -m harness.training.bilinear``.
        model: the evaluated model's name; a checkpoint trained on another model is refused.
    """

    needs_attention: ClassVar[bool] = False
    order_free: ClassVar[bool] = True  # one logit per entry, softmaxed over the entries in whatever order

    checkpoint: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, str):
            raise ValueError(f"method.scorer.checkpoint={self.checkpoint!r} is not a checkpoint path — {TRAIN}")
        model = self.model or "<model>"
        train = (
            f"train one with python -m harness.training.bilinear model={model} and pass method.scorer.checkpoint=<path>"
        )
        self.head, self.trained = load_bilinear(self.checkpoint, train)
        if self.model is not None and self.model != self.trained.model:
            raise ValueError(
                f"bilinear checkpoint {self.checkpoint!r} was trained for {self.trained.describe()} but is used with "
                f"model={self.model!r} — train one with python -m harness.training.bilinear model={self.model} "
                "and pass method.scorer.checkpoint=<path>"
            )

    def begin(self, info: SequenceInfo) -> None:
        trained = self.trained
        geometry = (info.num_layers, info.num_query_heads, info.num_kv_heads)
        if geometry != (trained.layers, trained.query_heads, trained.kv_heads):
            raise ValueError(
                f"bilinear checkpoint {self.checkpoint!r} was trained for {trained.describe()} but is used with a "
                f"model of {geometry[0]} layers, {geometry[1]} query / {geometry[2]} KV heads — {TRAIN}"
            )
        self.head.to(info.device)

    def score(self, view: LayerView) -> Tensor:
        with torch.no_grad():
            query = flat_queries(view.queries[:, -1:].float())
            logits = self.head.logits(query, flat_keys(view.keys.float()), view.layer)
        return logits.softmax(dim=-1).expand(view.keys.shape[0], -1)
