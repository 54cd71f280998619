"""FD-KVC's tables ("Fractional Decay KV-Cache", arXiv 2608.18098): the synthetic dialog world."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from harness.analysis.spec import (
    NOT_RUN,
    Axis,
    Line,
    Scope,
    TableSpec,
    benchmark_mean,
    fixed,
    mean,
    methods,
    models,
    one_per_example,
    product,
    variant_axis,
)
from tasks.dialogs.world import SCENARIOS

METHODS = ("fifo", "sink_window", "h2o", "fdkvc")
W_C = (0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
GAMMAS = (0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.95)


def shifting_scenarios() -> list[str]:
    return [name for name, spec in SCENARIOS.items() if spec.shifts()]


def scenario_columns(total: str, extra: Sequence[Line] = ()) -> Axis:
    return fixed(*(Line(s, {"subtask": s}) for s in SCENARIOS), Line(total), *extra)


def adaptation(records: pd.DataFrame, scope: Scope) -> str:
    """Cell: mean turns to adapt after a topic shift, and the share of shifts never adapted."""
    records = one_per_example(records)
    speed = benchmark_mean(records, "metric.adaptation")
    if math.isnan(speed):
        return NOT_RUN
    never = benchmark_mean(records, "metric.adaptation_never")
    return f"{speed:.2f} ({100 * never:.0f}%)"


def tables() -> list[TableSpec]:
    rows, world, mixed = (
        product(models(), methods(METHODS)),
        {"task": "dialogs"},
        fixed(Line("alignment (mixed)", {"subtask": "mixed"})),
    )
    return [
        TableSpec(
            "fdkvc_table1",
            "FD-KVC Table 1: late-turn alignment per scenario and composite",
            rows,
            scenario_columns("composite"),
            mean("metric.alignment", digits=3),
            "fdkvc_tables",
            where=world,
        ),
        TableSpec(
            "fdkvc_table2",
            "FD-KVC Table 2: adaptation speed, turns to 80% retention after a shift (share never adapted)",
            rows,
            fixed(*(Line(s, {"subtask": s}) for s in shifting_scenarios()), Line("mean")),
            adaptation,
            "fdkvc_tables",
            where={"task": "dialogs", "subtask": shifting_scenarios()},
        ),
        TableSpec(
            "fdkvc_table3",
            "FD-KVC Table 3: late diversity (% of the dialog's topics with a cached token)",
            rows,
            scenario_columns("mean"),
            mean("metric.diversity", scale=100),
            "fdkvc_tables",
            where=world,
        ),
        TableSpec(
            "fdkvc_table4",
            "FD-KVC Table 4: late retention (% of cache on the current topic) and method latency",
            rows,
            scenario_columns("mean", [Line("latency µs/turn", cell=mean("metric.latency_ms_per_turn", 1000))]),
            mean("metric.retention", scale=100),
            "fdkvc_tables",
            where=world,
        ),
        TableSpec(
            "fdkvc_table5",
            "FD-KVC Table 5: w_c ablation (w_recency = 1 - w_c), alignment on mixed",
            product(models(), variant_axis("fdkvc", "w_c", W_C, "w_c", lambda v: {"w_recency": round(1 - v, 6)})),
            mixed,
            mean("metric.alignment", digits=4),
            "fdkvc_table5",
            where=world,
        ),
        TableSpec(
            "fdkvc_table6",
            "FD-KVC Table 6: γ ablation, alignment on mixed",
            product(models(), variant_axis("fdkvc", "gamma", GAMMAS, "γ")),
            mixed,
            mean("metric.alignment", digits=4),
            "fdkvc_table6",
            where=world,
        ),
    ]
