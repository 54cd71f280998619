"""Base models fine-tuned under an eviction pattern: KVpop's joint recipe, StreamingLLM+ and DMS (KVpop, Sec. 4).

Training saves the fine-tuned weights as a transformers folder and writes ``FILENAME`` beside
them: the pattern they were trained under and its geometry. A method whose row means "these
weights under this pattern" checks that the run loads them (``model.source=hub
model.path=<folder>``): the same pattern on the untrained base model is another row (StreamingLLM
instead of StreamingLLM+), and silently labelling it as the trained one would be wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FILENAME = "evictbench_finetune.json"


@dataclass(frozen=True)
class Finetune:
    """What a fine-tuned base model was trained under.

    Parameters:
        pattern: ``kvpop`` (the running top-k of a scorer), ``dms`` (relaxed eviction gates) or
            ``streaming`` (sinks + the most recent tokens, StreamingLLM+).
        model: the ``conf/model`` name of the base model it started from.
        sinks, window: the pattern's protected tokens per KV head.
        budget: entries per KV head the pattern keeps (``B``).
        policy: the policy checkpoint trained with it (None for ``streaming``).
        weights_sha256: SHA-256 of the saved weights file: a retrained model writes another record.
    """

    pattern: str
    model: str
    sinks: int
    window: int
    budget: int
    policy: str | None = None
    weights_sha256: str | None = None

    def write(self, folder: str | Path) -> Path:
        path = Path(folder) / FILENAME
        path.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n")
        return path


def same_folder(a: str | Path | None, b: str | Path | None) -> bool:
    return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()


def read_finetune(weights: str | None) -> Finetune | None:
    """The fine-tuning record of the model folder ``weights`` (None: no folder, or no record in it)."""
    if weights is None:
        return None
    path = Path(weights) / FILENAME
    if not path.is_file():
        return None
    try:
        return Finetune(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path} is not a fine-tuning record ({error}) — train the model again") from None


def require_finetune(weights: str | None, pattern: str, method: str, train: str) -> Finetune:
    """The record of ``weights``, refused unless they were fine-tuned under ``pattern``.

    ``method`` names the method in the message; ``train`` is the command that makes such weights.
    """
    record = read_finetune(weights)
    if record is None:
        raise ValueError(
            f"method={method} needs a base model fine-tuned under its pattern, but model.path={weights!r} holds no "
            f"{FILENAME} — train one with {train} and run with model.source=hub model.path=<its model folder>"
        )
    if record.pattern != pattern:
        raise ValueError(
            f"model.path={weights!r} was fine-tuned under the {record.pattern} pattern, not the {pattern} pattern "
            f"method={method} evaluates — point model.path at weights trained with {train}"
        )
    return record
