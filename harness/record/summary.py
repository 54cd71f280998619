"""Aggregate figures of one run, recomputed from its records."""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any


def _mean_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    names: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for name, value in record["metrics"].items():
            names[name].append(float(value))
    return {name: fmean(values) for name, values in names.items()}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean metrics overall, per subtask and per (subtask, length), plus cache and speed figures.

    ``overall`` averages subtask means (the paper convention: every subtask weighs the same),
    each subtask contributing its own primary metric (RULER's qa tasks score
    ``string_match_part`` where the others score ``string_match_all``).
    """
    if not records:
        return {"n": 0}
    by_subtask: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_length: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_subtask[record["subtask"]].append(record)
        length = record.get("meta", {}).get("length")
        if length is not None:
            by_length[f"{record['subtask']}/{length}"].append(record)
    subtasks = {name: _mean_metrics(group) for name, group in sorted(by_subtask.items())}
    primaries = {name: next(iter(group[0]["metrics"])) for name, group in sorted(by_subtask.items())}
    decode_tokens = sum(max(r["new_tokens"] - 1, 0) for r in records)
    decode_s = sum(r["decode_s"] for r in records)
    return {
        "n": len(records),
        "primary_metric": next(iter(records[0]["metrics"])),
        "subtask_primary_metric": primaries,
        "overall": fmean(subtasks[name][metric] for name, metric in primaries.items()),
        "subtasks": subtasks,
        "lengths": {name: _mean_metrics(group) for name, group in sorted(by_length.items())},
        "kv_ratio_final": fmean(r["kv_bytes_final"] / r["kv_bytes_full"] for r in records),
        "prefill_len_mean": fmean(r["prefill_len"] for r in records),
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
        "score_share": (
            sum(r["score_s"] for r in records) / decode_s
            if decode_s > 0 and all(r.get("score_s") is not None for r in records)
            else None
        ),
        "prefill_s": sum(r["prefill_s"] for r in records),
        "decode_s": decode_s,
        # Timings of sequences decoded together are the batch's (records before batching had none: 1).
        "batch_sizes": sorted({r.get("meta", {}).get("batch_size", 1) for r in records}),
    }
