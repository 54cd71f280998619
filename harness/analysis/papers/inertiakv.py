"""InertiaKV's tables ("What Matters for Aggressive Decoding-Time KV Eviction?", arXiv 2609.03515)."""

from __future__ import annotations

from harness.analysis.spec import (
    Line,
    TableSpec,
    diff_columns,
    fixed,
    mean,
    methods,
    models,
    named,
    present_variants,
    product,
    rho_label,
    subtasks,
    values,
    variant_axis,
)
from harness.analysis.variants import variant

RHOS: tuple[float, ...] = (0.5, 0.75, 0.9)
BASELINES = ("full", "streaming_llm", "h2o", "tova", "snapkv", "inertia")
SCORERS = ("attention", "vnorm", "entropy", "keydiff", "keynorm", "recency", "random")
ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95)
TRANSFER = {"attention": "TOVA (attention)", "keydiff": "KeyDiff", "keynorm": "KNorm"}
EMA = {"p.aggregator": "ema", "p.aggregator.alpha": 0.8}

#: Diagnostic summaries (``harness.diagnostics.SUMMARY``) and their column labels.
DIAGNOSTIC_COLUMNS: dict[str, str] = {
    "churn": "top-B churn",
    "jaccard_raw_state": "raw/EMA Jaccard",
    "raw_top_evicted": "raw-top evicted",
    "spearman_vs_attention": "Spearman vs attn",
    "jaccard_vs_attention": "top-B Jaccard vs attn",
}


def tables() -> list[TableSpec]:
    ruler = {"task": "ruler"}
    lengths = values("meta.length", fmt=lambda n: f"{int(n) // 1024}k" if n >= 1024 else str(int(n)))
    return [
        TableSpec(
            "inertia_table1",
            "InertiaKV Table 1: RULER average (%) per context length and eviction ratio ρ",
            product(models(), methods(BASELINES)),
            product(lengths, values("rho", RHOS, rho_label, extra=False)),
            mean(),
            "inertia_table1",
            where=ruler,
        ),
        TableSpec(
            "inertia_table2",
            "InertiaKV Table 2: scorer ablation under EMA (α=0.8), RULER average (%)",
            product(models(), fixed(*(Line(s, {"variant": variant("inertia", {"scorer": s})}) for s in SCORERS))),
            values("rho", RHOS, rho_label),
            mean(),
            "inertia_table2",
            where=ruler,
        ),
        TableSpec(
            "inertia_table3",
            "InertiaKV Table 3: Score-Free vs full refresh per LongBench task, ρ=0.9 (paired bootstrap CI, t-test p)",
            product(models(), subtasks()),
            diff_columns(named("inertia"), named("score_free")),
            mean(),
            "inertia_table3",
            where={"task": "longbench", "rho": 0.9},
        ),
        TableSpec(
            "inertia_table4",
            "InertiaKV Table 4: baselines at ρ=0.9 on LongBench",
            product(models(), values("rho", (0.9,), rho_label, extra=False), methods(BASELINES)),
            subtasks(),
            mean(),
            "inertia_table4",
            where={"task": "longbench"},
        ),
        TableSpec(
            "inertia_table5",
            "InertiaKV Table 5: EMA α sweep (α=0: single-step), RULER, ρ=0.9",
            product(models(), variant_axis("inertia", "aggregator.alpha", ALPHAS, "α")),
            subtasks(),
            mean(),
            "inertia_table5",
            where={**ruler, "rho": 0.9},
        ),
        TableSpec(
            "inertia_table11",
            "InertiaKV Table 11: EMA transfer to other scorers in TOVA's per-layer framework, RULER average",
            product(
                models(),
                values("rho", RHOS, rho_label),
                fixed(*(Line(label, {"method": "tova", "p.scorer": s}) for s, label in TRANSFER.items())),
            ),
            diff_columns(("single-step", {"p.aggregator": "single"}), ("EMA α=0.8", EMA)),
            mean(),
            "inertia_table11",
            where=ruler,
        ),
        TableSpec(
            "inertia_table12",
            "InertiaKV Table 12: cumulative minus EMA on RULER (paired bootstrap CI)",
            product(models(), values("rho", RHOS, rho_label), subtasks()),
            diff_columns(named("inertia"), named("cumulative")),
            mean(),
            "inertia_table12",
            where=ruler,
        ),
        TableSpec(
            "inertia_table13",
            "InertiaKV Table 13: rank-trace diagnostics (per-step means over decode steps and examples)",
            product(models(), present_variants),
            fixed(*(Line(label, cell=mean(f"metric.{key}", digits=3)) for key, label in DIAGNOSTIC_COLUMNS.items())),
            mean(),
            "inertia_table13",
            source="diagnostics",
        ),
        TableSpec(
            "inertia_table14",
            "InertiaKV Table 14: Lazy-4 minus InertiaKV (paired bootstrap CI)",
            product(models(), values("task"), values("rho", RHOS, rho_label), subtasks()),
            diff_columns(named("inertia"), named("inertia_lazy")),
            mean(),
            "inertia_table14",
        ),
    ]
