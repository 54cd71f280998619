"""StreamingLLM+ (KVpop, arXiv 2607.05061, Sec. 4): StreamingLLM on a base model fine-tuned under its own pattern.

"To isolate the effect of learned scoring from training under a fixed sparse pattern", KVpop
fine-tunes the base model with the same budget and setup as KVpop under sinks + the most recent
tokens (``python -m harness.training.kvpop kvpop_recipe=streaming_llm_plus``). At inference the
method is StreamingLLM's; what makes the row is the weights, so the method reads the fine-tuning
record beside them (``methods.finetuned``) and refuses weights that were not trained so, or for
another geometry. The record is the ``checkpoint``: its digest enters the run id, and a retrained
model writes a new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from methods.finetuned import require_finetune
from methods.scored import ScoredEviction

TRAIN = "python -m harness.training.kvpop kvpop_recipe=streaming_llm_plus kvpop.budget=<B>"


@dataclass
class StreamingLLMPlus(ScoredEviction):
    """StreamingLLM's sinks + recent window, on weights fine-tuned under that pattern.

    Parameters (besides ``ScoredEviction``'s):
        checkpoint: the fine-tuning record ``<model folder>/evictbench_finetune.json`` of the
            weights the run loads (``${model.path}/evictbench_finetune.json`` in the config).
    """

    checkpoint: str | None = None
    name: str = "streaming_llm_plus"

    def __post_init__(self) -> None:
        super().__post_init__()
        weights = None if self.checkpoint is None else str(Path(self.checkpoint).parent)
        record = require_finetune(weights, "streaming", self.name, TRAIN)
        selection = self.selection
        if record.sinks != selection.sinks:
            raise ValueError(
                f"model.path={weights!r} was fine-tuned with {record.sinks} sinks but method.selection.sinks="
                f"{selection.sinks} — use method.selection.sinks={record.sinks}"
            )
        if selection.budget_tokens is not None and selection.budget_tokens != record.budget:
            raise ValueError(
                f"model.path={weights!r} was fine-tuned for a budget of {record.budget} entries but "
                f"method.selection.budget_tokens={selection.budget_tokens} — use "
                f"method.selection.budget_tokens={record.budget}, or weights trained for that budget ({TRAIN})"
            )
