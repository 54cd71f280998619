"""``harness.bench`` end to end on a tiny model: every row it prints is measured and consistent."""

from __future__ import annotations

import math
import sys

import pandas as pd
import torch

from harness import bench
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
    assert set(table.numerics) == {1}


def test_bench_runs_each_method_under_each_numerics_against_the_reference_full() -> None:
    table = run("tiny_llama", [512], [0.5], ["full", "inertia"], new_tokens=4, numerics=[1, 4])
    assert list(zip(table.method, table.numerics, strict=True)) == [
        ("full", 1),
        ("inertia", 1),
        ("inertia", 4),
        ("full@B", 1),
    ]
    rows = table.set_index(["method", "numerics"])
    # The same budget and cache under either numerics; speeds against the one full.
    assert (
        rows.loc[("inertia", 1), "budget"] == rows.loc[("inertia", 4), "budget"] == rows.loc[("full@B", 1), "context"]
    )
    for number in (1, 4):
        speed = rows.loc[("inertia", number), "decode_tok_s"] / rows.loc[("full", 1), "decode_tok_s"]
        assert rows.loc[("inertia", number), "x_full"] == speed


def test_the_ops_table_counts_a_gpus_default_numerics_and_the_timed_tables_their_devices(monkeypatch) -> None:
    taken = {}

    def ops_table(methods, dtypes, batch_sizes, numerics) -> str:
        taken["ops"] = numerics
        return ""

    def single(*args) -> pd.DataFrame:
        taken["single"] = args[-1]
        return pd.DataFrame()

    monkeypatch.setattr(bench, "ops_table", ops_table)
    monkeypatch.setattr(bench, "run", single)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["--ops"], ["--model", "tiny_llama"]):
        monkeypatch.setattr(sys, "argv", ["bench", *argv])
        bench.main()
    assert taken == {"ops": [4], "single": [1]}
