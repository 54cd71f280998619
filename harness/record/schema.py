"""The run schema: the run id and the record fields. Every writer and reader goes through here.

A run id names a results folder and is derived from the config, never from the clock::

    <model>[-<model hash>]__<method>-<method hash>__<task>-<task hash>__rho<rho>__seed<seed>

- ``model``: the ``conf/model`` preset; ``-<model hash>`` is added when anything that changes
  the model's outputs differs from that preset on a CPU in float32 (dtype, device type,
  ``model.config.*`` overrides, path, revision, GGUF digest, attention kernel), so runs of the
  unchanged preset keep the ids they always had;
- ``method hash``: every method parameter, the content digest of a checkpoint file, and the
  diagnostics switch (diagnostic runs time differently);
- ``task hash``: the task's protocol (``Task.identity()``, local data files by content), plus
  sampling when not greedy;
- ``rho``: the compression ratio as a float (``format_rho``), so ``rho=0`` and ``rho=0.0`` name
  one run.

``harness.record.identity`` computes the identity; ``SCHEMA_VERSION`` numbers its rules and the record
format, and every record carries the version it was written under (records without one are
version 1). Version 2: local data files by content, rho as a float, the batch size above 1 in
the model part.

A record (one line of ``records.jsonl``) carries the identity fields, the outcome fields and
``meta``; ``identity`` holds what each hash was computed from, so a record says by itself
which model, method and protocol produced it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

#: The rules of the run id and the record format records are written under today.
SCHEMA_VERSION = 2

#: Fields naming what produced a record (``identity`` holds the hashed parts in full).
IDENTITY_FIELDS: tuple[str, ...] = (
    "run_id", "model", "method", "task", "subtask", "rho", "seed", "example_id", "identity",
)  # fmt: skip

#: Numeric per-example outcome fields (timings in seconds, sizes in entries and bytes).
#: ``kv_entries_final`` is logical (entries attention can see, mean per layer and KV head: a
#: masked entry does not count); ``kv_entries_held`` (entries held, the same mean) and
#: ``kv_bytes_final`` (bytes held) are physical; ``cache_len_final`` is the longest head's
#: length. The peaks are the CUDA allocator's (weights and activations included) on a GPU and
#: the cache's key/value bytes elsewhere, of the prefill (reconstruction passes and prefill
#: eviction included) and of decoding.
NUMERIC_FIELDS: tuple[str, ...] = (
    "prefill_len", "budget", "cache_len_final", "kv_entries_final", "kv_entries_held", "kv_bytes_final",
    "kv_bytes_full", "state_bytes", "prefill_peak_bytes", "decode_peak_bytes",
    "prefill_s", "decode_s", "new_tokens", "decode_tokens_per_s", "score_s", "evict_s", "prefill_score_s",
)  # fmt: skip

#: Outcome fields in record order: the decoded text and metrics, then the numeric fields.
OUTCOME_FIELDS: tuple[str, ...] = ("prediction", "metrics", *NUMERIC_FIELDS)

#: Every top-level field of a record, in the order it is written.
RECORD_FIELDS: tuple[str, ...] = (
    "schema_version", *IDENTITY_FIELDS[:-1], "answers", *OUTCOME_FIELDS, "identity", "meta",
)  # fmt: skip

_HASH = re.compile(r"[0-9a-f]{8}")


def canonical_rho(rho: int | float) -> float:
    """rho as every part of a run sees it: a float (``0`` and ``0.0`` are one setting)."""
    return float(rho)


def format_rho(rho: int | float) -> str:
    """rho as the run id writes it: ``0.0``, ``0.5``, ``0.9``."""
    return repr(canonical_rho(rho))


def digest(value: Any) -> str:
    """Eight hex digits of the SHA-256 of ``value`` as canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class RunId:
    """A run id, formatted by ``str()`` and read back by ``RunId.parse``.

    Parameters:
        model: the model preset name (``world`` for tasks that need no model).
        model_params: hash of what differs from the preset, or None when nothing does.
        method, method_params: method name and the hash of its parameters.
        task, task_params: task name and the hash of its protocol.
        rho: the compression ratio, ``format_rho``'s text.
        seed: the run's seed.
    """

    model: str
    model_params: str | None
    method: str
    method_params: str
    task: str
    task_params: str
    rho: str
    seed: str

    def __str__(self) -> str:
        model = self.model if self.model_params is None else f"{self.model}-{self.model_params}"
        return (
            f"{model}__{self.method}-{self.method_params}__{self.task}-{self.task_params}"
            f"__rho{self.rho}__seed{self.seed}"
        )

    @classmethod
    def parse(cls, text: str) -> RunId:
        """The parts of a run id; raises ``ValueError`` for anything else.

        Split from the right, so a model name holding ``__`` still parses.
        """
        parts = text.rsplit("__", 4)
        if len(parts) != 5:
            raise ValueError(f"not a run id: {text!r}")
        model_part, method_part, task_part, rho_part, seed_part = parts
        if not (rho_part.startswith("rho") and seed_part.startswith("seed")):
            raise ValueError(f"not a run id (no rho/seed): {text!r}")
        method, _, method_params = method_part.rpartition("-")
        task, _, task_params = task_part.rpartition("-")
        if not (method and method_params and task and task_params):
            raise ValueError(f"not a run id (method or task hash missing): {text!r}")
        model, _, model_params = model_part.rpartition("-")
        if not (model and _HASH.fullmatch(model_params)):
            model, model_params = model_part, None
        return cls(model, model_params, method, method_params, task, task_params, rho_part[3:], seed_part[4:])
