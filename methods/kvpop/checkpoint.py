"""Checkpoints of a learned eviction policy (KVpop's scorers, DMS's gates): safetensors weights plus
the model and training config in the metadata.

The metadata (``kvpop`` key, JSON) is the single source of truth for what the policy serves:
the model name and attention geometry it was trained on, the scorer's hyper-parameters, the
policy it was trained for (``sinks``, ``window``, ``k``, ``bucket``, and ``budget``, the per-head
memory budget ``B``), the objective that trained it (``kvpop`` or ``dms``) and, when the base
model was fine-tuned with it (the paper's joint recipe), the folder of those weights. A JSON
copy is written next to the weights for people.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from methods.checkpoint import read_checkpoint, write_checkpoint
from methods.kvpop.scorers import KVpopScorer, build_scorer

METADATA_KEY = "kvpop"
TRAIN = "train one with python -m harness.training.kvpop model=<model> and pass method.checkpoint=<path>.safetensors"
WRITTEN_BY = "pass a checkpoint written by python -m harness.training.kvpop"


@dataclass
class CheckpointInfo:
    """What a checkpoint was made for.

    Parameters:
        model: model name (``conf/model`` name, e.g. ``smollm2_135m``).
        layers, kv_heads, head_dim: its attention geometry.
        scorer: scorer hyper-parameters (``kind`` plus the constructor arguments).
        policy: ``sinks``, ``window``, ``k``, ``bucket`` (and ``budget``) the scorer was trained for.
        train: the training config, for provenance.
        objective: what trained the scorer: ``kvpop`` (the boundary loss on future attention) or
            ``dms`` (DMS's relaxed eviction gates); a policy serves only its own kind.
        base_model: folder of the base model fine-tuned jointly with the scorer (None: the scorer
            was trained on the frozen base model).
    """

    model: str
    layers: int
    kv_heads: int
    head_dim: int
    scorer: dict[str, Any]
    policy: dict[str, int]
    train: dict[str, Any] = field(default_factory=dict)
    objective: str = "kvpop"
    base_model: str | None = None

    def describe(self) -> str:
        return f"{self.model} ({self.layers} layers, {self.kv_heads} KV heads, head_dim {self.head_dim})"

    def check_model(self, model: str, checkpoint: str) -> None:
        """Refuse a model other than the one the scorer was trained on, naming both."""
        if model != self.model:
            raise ValueError(
                f"KVpop checkpoint {checkpoint!r} was trained for {self.describe()} but is used with "
                f"model={model!r} — train one for {model} with python -m harness.training.kvpop model={model} "
                "and pass method.checkpoint=<path>.safetensors"
            )

    def check_geometry(self, checkpoint: str, layers: int, kv_heads: int, head_dim: int | None = None) -> None:
        """Refuse an attention geometry other than the checkpoint's (``head_dim`` None: not known yet)."""
        if (layers, kv_heads) != (self.layers, self.kv_heads) or head_dim not in (None, self.head_dim):
            dim = "" if head_dim is None else f", head_dim {head_dim}"
            raise ValueError(
                f"KVpop checkpoint {checkpoint!r} was trained for {self.describe()} but is used with a model of "
                f"{layers} layers, {kv_heads} KV heads{dim} — {TRAIN}"
            )


def save_checkpoint(scorer: KVpopScorer, path: str | Path, info: CheckpointInfo) -> Path:
    """Write ``path`` (safetensors) and ``path`` with ``.json`` (the same metadata, readable)."""
    return write_checkpoint(dict(scorer.state_dict()), path, METADATA_KEY, info.__dict__)


def load_checkpoint(path: str | Path) -> tuple[KVpopScorer, CheckpointInfo]:
    """The scorer stored at ``path`` (eval mode, CPU) and what it was made for."""
    tensors, meta = read_checkpoint(path, METADATA_KEY, TRAIN, label="KVpop", rejected=WRITTEN_BY)
    try:
        info = CheckpointInfo(**meta)
        hyper = dict(info.scorer)
        kind = hyper.pop("kind")
    except (ValueError, TypeError, KeyError) as error:  # dict() of a non-mapping: ValueError
        raise ValueError(f"{path} holds malformed KVpop metadata ({error!r}) — {WRITTEN_BY}") from None
    scorer = build_scorer(kind, info.layers, info.kv_heads, info.head_dim, **hyper)
    try:
        scorer.load_state_dict(tensors)
    except RuntimeError:
        # load_state_dict lists every missing or mismatched tensor, over many lines.
        raise ValueError(f"{path}: the stored tensors do not match its {kind} scorer — {WRITTEN_BY}") from None
    return scorer.eval(), info
