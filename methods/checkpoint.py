"""Learned-scorer checkpoints: safetensors weights with what they were trained for as JSON metadata.

The metadata under ``key`` is the single source of truth for the model and geometry a scorer
serves; a readable JSON copy is written next to the weights. Reading refuses, in one line, a
missing file, a file that is not safetensors, and one without the expected metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor


def write_checkpoint(tensors: dict[str, Tensor], path: str | Path, key: str, meta: dict[str, Any]) -> Path:
    """Write ``path`` (safetensors, ``meta`` under ``key``) and ``path`` with ``.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().contiguous().cpu() for name, value in tensors.items()}
    # Written beside and renamed into place: a run hashing or loading the path never sees half a file.
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    save_file(tensors, str(partial), metadata={key: json.dumps(meta, sort_keys=True, default=str)})
    os.replace(partial, path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_checkpoint(
    path: str | Path, key: str, train: str, label: str | None = None, rejected: str | None = None
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors and the ``key`` metadata of ``path``.

    ``train`` says how to make one (the fix for a missing file), ``rejected`` how to get a good
    one (the fix for a file that is not a checkpoint; default ``train``); ``label`` names the
    kind in messages (default ``key``).
    """
    path, label, rejected = Path(path), label or key, rejected or train
    if not path.is_file():
        raise FileNotFoundError(f"{label} checkpoint {str(path)!r} does not exist — {train}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except SafetensorError as error:
        raise ValueError(f"{path} is not a safetensors file ({error}) — {rejected}") from None
    if key not in metadata:
        raise ValueError(f"{path} is a safetensors file without {label} metadata — {rejected}")
    try:
        meta = json.loads(metadata[key])
    except ValueError as error:
        raise ValueError(f"{path} holds malformed {label} metadata ({error!r}) — {rejected}") from None
    return load_file(str(path)), meta
