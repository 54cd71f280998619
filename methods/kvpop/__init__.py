"""KVpop: learned per-KV-head eviction (scorers, checkpoints, ranking, the inference policy, the teacher recall)."""

from methods.kvpop.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from methods.kvpop.policy import KVpop, state_entries
from methods.kvpop.ranking import effective_score, static_base, static_priority
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
    "state_entries",
    "static_base",
    "static_priority",
]
