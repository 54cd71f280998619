"""KVpop's tables ("KVpop: Key-Value Cache Compression with Predictive Online Pruning", arXiv 2607.05061)."""

from __future__ import annotations

from harness.analysis.spec import TableSpec, mean, methods, models, product, relative_to_full, rho_label, values

RHOS: tuple[float, ...] = (0.75, 0.88)
METHODS = ("full", "streaming_llm", "h2o", "tova", "snapkv", "inertia", "kvpop", "kvpop_mlp")


def tables() -> list[TableSpec]:
    return [
        *(
            TableSpec(
                f"kvpop_table{number}",
                f"KVpop Table {number}: {what} at 75% and 88% eviction",
                product(models(), methods(METHODS)),
                product(values("task", ("aime", "hmmt")), values("rho", RHOS, rho_label, extra=False)),
                cell,
                "kvpop_tables",
                where={"task": ["aime", "hmmt", "ruler", "longbench", "longbench_v2"]},
            )
            for number, what, cell in (
                (1, "score", mean()),
                (2, "score relative to the full cache", relative_to_full()),
            )
        ),
    ]
