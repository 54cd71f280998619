"""KVpop's tables ("KVpop: Key-Value Cache Compression with Predictive Online Pruning", arXiv 2607.05061).

Table 1: pass@1 per competition (AIME 2024/2025, HMMT Feb/Nov 2025) with the average (Abs) and the
average relative to the dense teacher (Rel); Table 2: GPQA-Diamond and LiveCodeBench v6. Both at
CR = 75% and 88%, the fixed budgets B = 4096 and 2048 entries per KV head (CPU form: 96 and 48, the
budgets ``conf/experiment/kvpop/forms.yaml`` pairs with each point). A row is a method at the
point's rho and budget, so a KVpop run at another budget never fills a cell of these tables.
"""

from __future__ import annotations

from harness.analysis.spec import Line, TableSpec, fixed, mean, models, product, relative_to_full
from harness.analysis.variants import display

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

COMPETITIONS = {
    "aime_2024": "AIME 2024",
    "aime_2025": "AIME 2025",
    "hmmt_feb_2025": "HMMT 2502",
    "hmmt_nov_2025": "HMMT 2511",
}


def rows() -> list[Line]:
    """The teacher, then every method at each CR point."""
    lines = [Line("Teacher", {"variant": "full"})]
    for point, (rho, budgets) in POINTS.items():
        for method, label in ROWS.items():
            key = "p.selection.budget_tokens" if method in SELECTION_BUDGET else "p.budget_tokens"
            lines.append(Line(f"CR={point} · {label}", {"method": method, "rho": rho, key: list(budgets)}))
    return lines


def tables() -> list[TableSpec]:
    competitions = [Line(label, {"subtask": name}) for name, label in COMPETITIONS.items()]
    return [
        TableSpec(
            "kvpop_table1",
            "KVpop Table 1: pass@1 on AIME and HMMT, absolute (Abs) and relative to the teacher (Rel)",
            product(models({"task": ["aime", "hmmt"]}), fixed(*rows())),
            fixed(*competitions, Line("Abs"), Line("Rel", cell=relative_to_full(digits=0))),
            mean(digits=2),
            "kvpop_table1",
            where={"task": ["aime", "hmmt"]},
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
