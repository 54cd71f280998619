"""KVpop: learned per-KV-head eviction (scorers, checkpoints, the inference policy)."""

from methods.kvpop.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from methods.kvpop.policy import KVpop, effective_score, static_base, static_priority
from methods.kvpop.scorers import MLPScorer, MLSTMScorer, build_scorer

__all__ = [
    "CheckpointInfo",
    "KVpop",
    "MLPScorer",
    "MLSTMScorer",
    "build_scorer",
    "effective_score",
    "load_checkpoint",
    "save_checkpoint",
    "static_base",
    "static_priority",
]
