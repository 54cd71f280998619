"""Rank-trace diagnostics on hand-made sequences, and the recorder on a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.decode.engine import Request
from harness.decode.retention import (
    StepSnapshot,
    boundary_margin,
    churn,
    normalised_entropy,
    spearman,
    summarize_series,
    top_b,
    trace_series,
)
from methods.overlap import jaccard


def test_set_measures() -> None:
    assert top_b([0, 1, 2, 3], [0.1, 0.5, 0.5, 0.2], 2) == {1, 2}
    assert top_b([0, 1, 2], [0.3, 0.3, 0.1], 1) == {1}  # tie: the more recent position
    assert jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3) and jaccard(set(), set()) == 1.0
    assert churn({1, 2, 3, 4}, {1, 2, 5, 6}) == 0.5 and math.isnan(churn(set(), {1}))
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_trace_series_by_hand() -> None:
    positions = np.array([0, 1, 2, 3])
    steps = [
        StepSnapshot(
            1,
            positions,
            np.array([0, 1]),
            raw=np.array([4.0, 3, 2, 1]),
            state=np.array([4.0, 3, 2, 1]),
            attention=np.array([4.0, 3, 2, 1]),
        ),  # fmt: skip
        # Raw top-2 moves to {2, 3}; the state still prefers {0, 2}; the method keeps {0, 2}.
        StepSnapshot(
            2,
            positions,
            np.array([0, 2]),
            raw=np.array([1.0, 2, 4, 3]),
            state=np.array([5.0, 1, 4, 0]),
            attention=np.array([4.0, 3, 2, 1]),
        ),  # fmt: skip
        StepSnapshot(3, positions, np.array([0, 2])),  # not observed (lazy step)
    ]
    series = trace_series(steps, budget=2)
    assert math.isnan(series["churn"][0]) and series["churn"][1] == 0.5 and series["churn"][2] == 0.0
    assert series["churn_raw"][1] == 1.0
    assert series["jaccard_raw_state"] == [1.0, pytest.approx(1 / 3), series["jaccard_raw_state"][2]]
    assert series["raw_top_evicted"][1] == 0.5
    assert series["spearman_vs_attention"][0] == pytest.approx(1.0)
    assert series["spearman_vs_attention"][1] == pytest.approx(-0.8)
    assert series["jaccard_vs_attention"][1] == 0.0
    assert all(math.isnan(series[name][2]) for name in series if name != "churn")
    summary = summarize_series(series)
    assert summary["churn"] == 0.25 and summary["raw_top_evicted"] == 0.25


def test_recorder_on_a_tiny_model(tmp_path, tiny_models) -> None:
    from conftest import named_method

    from harness.analysis.diagnostics import read_diagnostics
    from harness.decode.engine import Engine
    from harness.decode.retention import RetentionRecorder
    from harness.record.files import CompanionFile, RecordFile

    engine = Engine(tiny_models["tiny_llama"], named_method("inertia", "rho=0.5"))
    recorder = RetentionRecorder.attach(engine)
    records = RecordFile(tmp_path / "records.jsonl")
    diagnostics = CompanionFile(tmp_path / "diagnostics.jsonl", records)
    for example in ("a/0", "a/1", "a/2"):
        engine.generate(Request(list(range(5, 45)), 6))
        diagnostics.append(recorder.finish(example, "a"))
        if example != "a/2":
            records.append({"example_id": example, "metrics": {"score": 1.0}})
    # a/2 has no record (as after a kill between the two writes): readers leave it out.
    lines = read_diagnostics(tmp_path)
    assert [line["example_id"] for line in lines] == ["a/0", "a/1"]
    assert all(line["steps"] == 5 and len(line["kept"]) == 5 for line in lines)
    assert all(len(kept) == 20 for kept in lines[0]["kept"])
    # The attention scorer compared with attention itself.
    assert lines[0]["summary"]["spearman_vs_attention"] == pytest.approx(1.0)
    # Sec. 5.1's first-step comparison at layer 15 (the last layer of a model with fewer), over the whole cache,
    # and k = ceil(0.1 * B).
    assert lines[0]["summary"]["spearman_at_layer"] == pytest.approx(1.0)
    assert lines[0]["summary"]["jaccard_at_layer"] == 1.0
    assert lines[0]["top_k"] == 2
    first = lines[0]["first_scores"]
    assert first["positions"] == list(range(41)) and len(first["raw"]) == 41


def test_the_tap_keeps_the_scorers_cache_order_needs() -> None:
    # The tapped scorer reads the cache's order as the one it wraps does: no slot refills under norm scorers.
    from conftest import named_method

    from harness.decode.retention import RetentionRecorder

    for scorer, order_free in (("attention", True), ("vnorm", False), ("keynorm", False)):
        method = named_method("inertia", "rho=0.5", f"method/scorer={scorer}")
        RetentionRecorder(method)
        assert type(method.scorer).__name__ == "_Tap" and method.order_free is order_free, scorer


def test_trace_measures_on_the_top_k_and_at_the_boundary_by_hand() -> None:
    positions = np.array([0, 1, 2, 3])
    steps = [
        StepSnapshot(1, positions, np.array([0, 1]), raw=np.array([4.0, 3, 2, 1]), state=np.array([4.0, 3, 2, 1]),
                     attention=np.array([4.0, 3, 2, 1])),
        StepSnapshot(2, positions, np.array([0, 2]), raw=np.array([1.0, 2, 4, 3]), state=np.array([5.0, 1, 4, 0]),
                     attention=np.array([4.0, 3, 2, 1])),
    ]  # fmt: skip
    series = trace_series(steps, budget=2, k=1)
    # Top-1 by raw: {0} then {2}; by state: {0} then {0}.
    assert series["churn_raw"][1] == 1.0 and series["churn_state"][1] == 0.0
    assert series["jaccard_raw_state"] == [1.0, 0.0]
    assert series["raw_top_evicted"][1] == 0.0
    # The comparison with attention keeps the budget: raw top-2 {2, 3} vs attention's {0, 1}.
    assert series["jaccard_vs_attention"][1] == 0.0
    # (2nd - 3rd largest state) / mean state: (3 - 2) / 2.5, then (4 - 1) / 2.5.
    assert series["boundary_margin"] == [pytest.approx(0.4), pytest.approx(1.2)]
    p = np.array([0.4, 0.3, 0.2, 0.1])
    assert series["score_entropy"][0] == pytest.approx(float(-(p * np.log(p)).sum() / np.log(4)))


def test_boundary_margin_and_entropy_edges() -> None:
    assert math.isnan(boundary_margin([3.0, 2.0], 2))
    assert normalised_entropy([1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert normalised_entropy([2.0, 0.0, 0.0]) == 0.0
    assert math.isnan(normalised_entropy([0.0, 0.0]))
