"""The run schema: the run id and the record fields, each declared once. Every writer and reader goes through here.

A run id names a results folder and is derived from the config, never from the clock::

    <model>[-<model hash>]__<method>-<method hash>__<task>-<task hash>__rho<rho>__seed<seed>

- ``model``: the ``conf/model`` preset; ``-<model hash>`` is added when anything that changes
  the model's outputs differs from that preset on a CPU in float32 at batch 1 (dtype, device
  type, ``model.config.*`` overrides, path, revision, GGUF digest, weight seed, batch size), so
  runs of the unchanged preset keep the ids they always had;
- ``method hash``: every method parameter but rho, the content digest of a checkpoint file, and
  the diagnostics switch (diagnostic runs time differently);
- ``task hash``: the task's protocol (``Task.identity()``, local data files by content), plus
  sampling when not greedy;
- ``rho``: the compression ratio as a float (``format_rho``), in the run id once: ``rho=0`` and
  ``rho=0.0`` name one run.

``harness.record.identity`` computes the identity. ``SCHEMA_VERSION`` numbers its rules and the
record format, and every record carries the version it was written under (records without one
are version 1; ``harness.record.migrate`` moves older runs where today's rules put them):

- 2: local data files by content, rho as a float, the batch size above 1 in the model part;
- 3: rho out of the method hash (a method's ``rho`` is the run's, already in the id).

A record (one line of ``records.jsonl``) carries ``schema_version``, the identity fields, the
decoded text and metrics, the numeric ``Figures`` and ``meta``; ``identity`` holds what each
hash was computed from, so a record says by itself which model, method and protocol produced it.

``Figures`` is the one declaration of the numeric fields: their type, their value where a
producer does not measure them, how an example of several model calls combines them, and their
meaning. The engine's output is a ``Figures`` (``harness.decode.engine.Generation``), records
and summaries take their fields from it, the analysis its columns, and the README's record table
is checked against it (``record_table``). A new figure is additive: it is declared here, set where
it is measured, and older records simply lack it (read as unmeasured), so it needs no new
``SCHEMA_VERSION``; a change to what an existing field means, or to the run id's rules, does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: The rules of the run id and the record format records are written under today.
SCHEMA_VERSION = 3

#: How an example made of several model calls (``tasks.base.Call``) combines a figure: summed over the
#: calls, the largest call's (by ``kv_bytes_full``), or derived from the combined figures.
OverCalls = Literal["sum", "largest", "derived"]


def figure(default: Any, over_calls: OverCalls, meaning: str) -> Any:
    """A ``Figures`` field: its value where not measured, how calls combine it, its meaning (the README's)."""
    return dataclasses.field(default=default, metadata={"over_calls": over_calls, "meaning": meaning})


@dataclass
class Figures:
    """The numbers a record carries about its example (timings in seconds, sizes in entries and bytes).

    A size no producer measured is null; a time it did not spend is 0. Logical versus physical:
    ``kv_entries_final`` counts what attention can see, ``kv_entries_held`` and ``kv_bytes_final``
    what memory holds. On a GPU the peaks are the CUDA allocator's (weights and activations
    included); elsewhere the cache's key and value bytes.
    """

    prefill_len: int | None = figure(None, "largest", "L0, prompt tokens")
    budget: int | None = figure(None, "largest", "entries kept per layer and KV head (null: no eviction)")
    cache_len_final: int | None = figure(
        None, "largest", "entries cached after the last step, max over layers and heads"
    )
    kv_entries_final: float | None = figure(
        None,
        "largest",
        "entries attention can see after the last step, mean over layers and KV heads (logical: a masked entry,"
        " as in `kvzip_mask`, is held but not counted)",
    )
    kv_entries_held: float | None = figure(
        None,
        "largest",
        "entries held in memory after the last step, mean over layers and KV heads (physical: a masked entry"
        " counts; AdaKV's short heads pull it below `cache_len_final`). The cost table's and Fig. 6's"
        ' "retained tokens"',
    )
    kv_bytes_final: int | None = figure(
        None,
        "largest",
        "bytes of keys+values physically held at the end (the cached entries; ragged layers: exactly their"
        " entries; plus a recurrent scorer's state)",
    )
    kv_bytes_full: int | None = figure(None, "largest", "bytes a full cache of the same sequence would hold")
    slot_bytes_final: int | None = figure(
        None,
        "largest",
        "bytes the cache's preallocated buffers hold at the end, free slots included (B + 1 slots at steady state;"
        " a full cache's whole preallocation)",
    )
    state_bytes: int | None = figure(
        None, "largest", "bytes of a recurrent scorer's state (KVpop's mLSTM), included in `kv_bytes_final`"
    )
    prefill_peak_bytes: int | None = figure(
        None,
        "largest",
        "memory peak of the prefill (layer-wise prefill eviction and KVzip's reconstruction passes included):"
        " CUDA allocator peak (weights and activations included) on a GPU, elsewhere the most key/value bytes"
        " the cache held",
    )
    decode_peak_bytes: int | None = figure(None, "largest", "memory peak of decoding, measured as the prefill's")
    prefill_s: float = figure(
        0.0,
        "sum",
        "wall time of the prefill (the forward, the method's prefill observation, KVzip's reconstruction passes"
        " and the prefill eviction)",
    )
    decode_s: float = figure(
        0.0,
        "sum",
        "wall time of the decode loop (at `batch_size` > 1, of the batch steps the sequence took part in;"
        " `meta.batch_size` says which)",
    )
    new_tokens: int = figure(0, "sum", "generated tokens (end-of-turn included)")
    decode_tokens_per_s: float | None = figure(None, "derived", "decode steps (`new_tokens` - 1) per second")
    score_s: float | None = figure(
        0.0, "sum", "time inside the method (observing, choosing) during decoding; null unless `profile=true`"
    )
    evict_s: float | None = figure(
        0.0, "sum", "time gathering kept entries during decoding; null unless `profile=true`"
    )
    prefill_score_s: float = figure(
        0.0,
        "sum",
        "the part of `prefill_s` inside the method: H2O's and SnapKV's prompt votes, KVzip's reconstruction"
        " scores, the prefill keep decisions",
    )


#: The numeric fields, in record order.
NUMERIC_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Figures))

#: Fields naming what produced a record (``identity`` holds the hashed parts in full).
IDENTITY_FIELDS: tuple[str, ...] = (
    "run_id", "model", "method", "task", "subtask", "rho", "seed", "example_id", "identity",
)  # fmt: skip

#: Outcome fields in record order: the decoded text and metrics, then the numeric fields.
OUTCOME_FIELDS: tuple[str, ...] = ("prediction", "metrics", *NUMERIC_FIELDS)

#: Every top-level field of a record, in the order it is written.
RECORD_FIELDS: tuple[str, ...] = (
    "schema_version", *IDENTITY_FIELDS[:-1], "answers", *OUTCOME_FIELDS, "identity", "meta",
)  # fmt: skip


def figures_of(source: Figures) -> Figures:
    """The declared figures of ``source`` (a ``Figures`` subclass such as the engine's ``Generation``)."""
    return Figures(**{name: getattr(source, name) for name in NUMERIC_FIELDS})


def decode_rate(figures: Figures) -> float | None:
    """``decode_tokens_per_s``: decode steps (every new token but the first, which the prefill gives) per second."""
    steps = max(figures.new_tokens - 1, 0)
    return steps / figures.decode_s if figures.decode_s > 0 else None


def combine_calls(calls: list[Figures]) -> Figures:
    """The figures of an example made of several model calls, each combined by its declared rule."""
    largest = max(calls, key=lambda figures: figures.kv_bytes_full or 0)
    combined = {name: getattr(largest, name) for name in NUMERIC_FIELDS}
    for field in dataclasses.fields(Figures):
        if field.metadata["over_calls"] == "sum":
            values = [getattr(figures, field.name) for figures in calls]
            # A time no call measured (an unprofiled share) stays unmeasured.
            combined[field.name] = None if None in values else sum(values)
    steps = sum(max(figures.new_tokens - 1, 0) for figures in calls)
    combined["decode_tokens_per_s"] = steps / combined["decode_s"] if combined["decode_s"] > 0 else None
    return Figures(**combined)


@dataclass
class Outcome:
    """What running one example gave, before it is a record (``harness.record.assemble``).

    Parameters:
        prediction: the decoded text the metrics scored (empty where there is none).
        metrics: the task's metrics, its primary one first.
        figures: the declared numbers.
        meta: anything else for the record's ``meta``, in order (after the example's own meta).
        trace: the example's ``diagnostics.jsonl`` line, written just before its record (None: none).
    """

    prediction: str
    metrics: dict[str, float]
    figures: Figures
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    trace: dict[str, Any] | None = None

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Outcome:
        """An outcome from one flat mapping (the dialog world's): the declared names are figures, the rest meta."""
        rest = dict(fields)
        prediction, metrics = rest.pop("prediction", ""), rest.pop("metrics")
        figures = Figures(**{name: rest.pop(name) for name in NUMERIC_FIELDS if name in rest})
        return cls(prediction, metrics, figures, rest)


def record_table() -> str:
    """The README's table of record fields, rows in record order (numeric ones from ``Figures``)."""
    meaning = {field.name: field.metadata["meaning"] for field in dataclasses.fields(Figures)}
    rows = [
        ("`schema_version`", "the rules of the run id and record format it was written under (see above)"),
        (
            "`run_id`, `model`, `method`, `task`, `subtask`, `rho`, `seed`, `example_id`",
            "identity (`model` is the preset name, `rho` a float)",
        ),
        ("`prediction`, `answers`", "decoded output (special tokens stripped) and references"),
        ("`metrics`", "dict, the task's primary metric first (`string_match_all` for RULER, 0-100)"),
        *((f"`{name}`", text) for name, text in meaning.items()),
        (
            "`identity`",
            "what the run id's hashes cover: `model` (source, path, revision, digest, config, dtype, device, batch"
            " size above 1), `method` (every parameter but rho, checkpoint digests), `task` (protocol, data file"
            " digests, sampling)",
        ),
        ("`meta`", "task details (RULER: `length`, `depths`, `prompt_tokens`, ...) and the run's `batch_size`"),
    ]
    return "\n".join(["| field | meaning |", "|---|---|", *(f"| {name} | {text} |" for name, text in rows)])


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{dotted key: value}``, the keys as a user writes them (``config.rope_theta``)."""
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        flat.update(flatten(inner, dotted) if isinstance(inner, Mapping) else {dotted: inner})
    return flat


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
