"""KVpop's tables ("KVpop: Key-Value Cache Compression with Predictive Online Pruning", arXiv 2607.05061).

Table 1: pass@1 per competition (AIME 2024/2025, HMMT Feb/Nov 2025) with the average (Abs) and the
average relative to the dense teacher (Rel, a ratio: the paper writes 0.98); Table 2: GPQA-Diamond and
LiveCodeBench v6. Both at CR = 75% and 88%, the fixed budgets B = 4096 and 2048 entries per KV head
(CPU form: 96 and 48, the budgets ``conf/experiment/kvpop/forms.yaml`` pairs with each point). A row
is a method's variant at the point's rho and budget: a KVpop run at another budget, and a traced run
of the same row (Figs. 6, 7 and 9: ``recall_queries``, ``pattern_tail``), fill no cell of these tables.
Table 1's columns are the competitions its runs recorded (the CPU form's offline problems are AIME
2024, AIME 2025 I and a part of MATH-500), the paper's four before any run.
"""

from __future__ import annotations

import pandas as pd

from harness.analysis.spec import Line, TableSpec, chain, fixed, mean, models, product, relative_to_full, restrict
from harness.analysis.variants import display, variant

#: CR point -> (rho, its budgets at the paper's scale and at the CPU form's).
POINTS: dict[str, tuple[float, tuple[int, ...]]] = {"75%": (0.75, (4096, 96)), "88%": (0.875, (2048, 48))}

#: The table's rows after the teacher, with the paper's names (``tova_decode``: TOVA evicting at each step).
ROWS: dict[str, str] = {
    "streaming_llm": "StreamLLM",
    "tova_decode": "TOVA",
    "streaming_llm_plus": "StreamLLM+",
    "dms": "DMS",
    "kvpop_mlp": "KVpop mlp",
    "kvpop": "KVpop",
    "kvpop_immediate": display("kvpop_immediate"),
}

#: Where each row's method keeps its fixed budget (the scored baselines in their selection).
SELECTION_BUDGET = ("streaming_llm", "tova_decode", "streaming_llm_plus")

#: Table 1's tasks: the paper's two, and MATH-500 (the CPU form's offline stand-in for HMMT).
MATH_TASKS = ("aime", "hmmt", "math500")
#: The paper's competitions, with its names.
COMPETITIONS = {
    "aime_2024": "AIME 2024",
    "aime_2025": "AIME 2025",
    "hmmt_feb_2025": "HMMT 2502",
    "hmmt_nov_2025": "HMMT 2511",
}
#: The parts the CPU form reads offline, named as parts.
PARTS = {"aime_2025_i": "AIME 2025 I (part)", "math500": "MATH-500 (subset)"}


def row_variant(method: str, budget: int) -> str:
    """The variant label of a table row's method at a fixed budget."""
    key = "selection.budget_tokens" if method in SELECTION_BUDGET else "budget_tokens"
    return variant(method, {key: budget})


def rows() -> list[Line]:
    """The teacher, then every method at each CR point."""
    lines = [Line("Teacher", {"variant": "full"})]
    for point, (rho, budgets) in POINTS.items():
        for method, label in ROWS.items():
            lines.append(
                Line(f"CR={point} · {label}", {"variant": [row_variant(method, b) for b in budgets], "rho": rho})
            )
    return lines


def competitions(frame: pd.DataFrame) -> list[Line]:
    """One column per competition recorded, the paper's first; the paper's four before any record."""
    recorded = restrict(frame, {"task": list(MATH_TASKS)})["subtask"].dropna().unique().tolist()
    names = {**COMPETITIONS, **PARTS}
    chosen = [c for c in names if c in recorded] + sorted(c for c in recorded if c not in names)
    return [Line(names.get(c, c), {"subtask": c}) for c in chosen or COMPETITIONS]


def tables() -> list[TableSpec]:
    return [
        TableSpec(
            "kvpop_table1",
            "KVpop Table 1: pass@1 on AIME and HMMT, absolute (Abs) and relative to the teacher (Rel)",
            product(models({"task": list(MATH_TASKS)}), fixed(*rows())),
            chain(competitions, fixed(Line("Abs"), Line("Rel", cell=relative_to_full()))),
            mean(digits=2),
            "kvpop_table1",
            where={"task": list(MATH_TASKS)},
        ),
        TableSpec(
            "kvpop_table2",
            "KVpop Table 2: GPQA-Diamond accuracy and LiveCodeBench v6 pass@1",
            product(models({"task": ["lm_eval", "livecodebench"]}), fixed(*rows())),
            fixed(
                Line("GPQA-D", {"task": "lm_eval", "subtask": "gpqa_diamond_cot_zeroshot"}),
                Line("LCB", {"task": "livecodebench"}),
            ),
            mean(digits=2),
            "kvpop_table2",
            where={"task": ["lm_eval", "livecodebench"]},
        ),
    ]
