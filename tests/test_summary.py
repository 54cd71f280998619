"""Run summaries: every subtask weighs the same, each through its own primary metric."""

from __future__ import annotations

import pytest

from harness.record.summary import summarize


def record(subtask: str, metrics: dict, length: int = 1024) -> dict:
    return {
        "subtask": subtask, "metrics": metrics, "meta": {"length": length}, "new_tokens": 5, "decode_s": 1.0,
        "score_s": 0.1, "prefill_s": 0.5, "kv_bytes_final": 10, "kv_bytes_full": 100, "prefill_len": 50,
    }  # fmt: skip


def test_overall_is_the_mean_of_subtask_primary_metrics():
    records = [
        record("vt", {"string_match_all": 100.0}),
        record("vt", {"string_match_all": 0.0}, length=2048),
        record("vt", {"string_match_all": 50.0}),
        record("qa_1", {"string_match_part": 20.0, "extra": 1.0}),
    ]
    summary = summarize(records)
    assert summary["subtask_primary_metric"] == {"qa_1": "string_match_part", "vt": "string_match_all"}
    assert summary["subtasks"]["vt"]["string_match_all"] == 50.0
    assert summary["overall"] == pytest.approx((50.0 + 20.0) / 2)
    assert summary["lengths"]["vt/1024"]["string_match_all"] == 75.0
    assert summary["kv_ratio_final"] == pytest.approx(0.1)
    assert summary["decode_tokens_per_s"] == pytest.approx(4.0)
    assert summary["score_share"] == pytest.approx(0.1)
    assert summarize([]) == {"n": 0}
