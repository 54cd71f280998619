"""``harness.bench`` end to end on a tiny model: every row it prints is measured and consistent."""

from __future__ import annotations

import math

from harness.bench import run


def test_bench_rows_for_prefill_scoring_and_reconstructing_methods() -> None:
    table = run("tiny_llama", [512], [0.5], ["full", "h2o", "kvzip"], new_tokens=4, profile=True).set_index("method")
    assert list(table.index) == ["full", "h2o", "kvzip", "full@B"]
    context = int(table.loc["full", "context"])
    budget = math.floor(0.5 * context)
    assert table.loc["h2o", "budget"] == table.loc["kvzip", "budget"] == budget
    assert table.loc["full@B", "context"] == budget and table.loc["full", "kv_ratio"] == 1.0
    for method in ("h2o", "kvzip"):
        assert table.loc[method, "kv_mb"] < table.loc["full", "kv_mb"]
        assert 0.0 < table.loc[method, "prefill_score_share"] < 1.0
    assert table.loc["full", "x_full"] == table.loc["full@B", "x_full@B"] == 1.0
    assert table.loc["full", "prefill_x_full"] == 1.0
