"""``python -m harness.tables [results_dir]`` (``make tables``): the papers' tables from the records on disk.

Every table is one ``TableSpec``: rows x columns x a cell function over the loaded records.
A row and a column are each a ``Line`` (a label and a record selection); a cell is the
cell function applied to the records both select. Tables differ only in their spec: which
lines, which cell (a mean, a paired difference with its bootstrap CI, a p-value, a ratio to
the full cache). Cells whose selection holds no record say "not run", so a table exists
(and shows what is missing) from the first run on.

A method variant is its name plus the parameters that differ from the named config
(``conf/method/<name>.yaml``), read from each run's resolved ``config.yaml``: e.g.
``inertia[aggregator.alpha=0.5]`` or ``tova[aggregator=ema, scorer=keydiff]``; a default
named method is just its name. Specs select variants by that label, so an alpha sweep
never leaks into the InertiaKV row of a baseline table.

Output: ``<results_dir>/tables/<table>.md`` and ``.tex`` per table and ``index.md``, which
maps each table to the experiment preset that fills it; then the figures (``harness.plots``).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from omegaconf import OmegaConf

from harness.config import CONF_DIR, compose_config
from harness.errors import cli, user_errors
from harness.results import load_configs, load_results
from harness.stats import PAIR_KEY, compare, select

log = logging.getLogger(__name__)

NOT_RUN = "not run"
AVERAGE = "average"
PAPER_RHOS: tuple[float, ...] = (0.5, 0.75, 0.9)
KVPOP_RHOS: tuple[float, ...] = (0.75, 0.88)

#: How the papers name the methods; a variant keeps its parameter suffix after the name.
LABELS: dict[str, str] = {
    "full": "Full cache",
    "streaming_llm": "StreamingLLM",
    "h2o": "H2O",
    "tova": "TOVA",
    "snapkv": "SnapKV",
    "inertia": "InertiaKV",
    "inertia_lazy": "InertiaKV Lazy-4",
    "score_free": "Score-Free",
    "cumulative": "Cumulative",
    "single_step": "Single-step",
    "fdkvc": "FD-KVC",
    "fifo": "FIFO",
    "sink_window": "Sink(4)+Window",
    "kvpop": "KVpop",
    "kvpop_mlp": "KVpop (MLP)",
}

# Keys of a method config that never distinguish variants: the name is the variant's stem,
# and selection.rho is the run's rho (an interpolation), already an identity column.
_NOT_PARAMS = frozenset({"name", "selection.rho"})

Where = Mapping[str, Any]


# --------------------------------------------------------------------------- method variants
@cache
def _option_names() -> dict[str, str]:
    """``_target_`` of every scorer/aggregator option -> its option name (``keydiff``, ``ema``)."""
    names: dict[str, str] = {}
    for group in ("scorer", "aggregator"):
        for path in sorted((CONF_DIR / "method" / group).glob("*.yaml")):
            target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
            if target:
                names[target] = path.stem
    return names


def _short(target: str) -> str:
    # The option name a user types (method/scorer=keydiff) reads better than a class path.
    return _option_names().get(target, target.rsplit(".", 1)[-1].lower())


def flatten_method(method: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A method config as ``{dotted key: value}``; a nested ``_target_`` becomes its option name.

    ``{"scorer": {"_target_": "...KeyDiffScorer"}, "aggregator": {"_target_": "...EMA", "alpha": 0.8}}``
    gives ``{"scorer": "keydiff", "aggregator": "ema", "aggregator.alpha": 0.8}``.
    """
    flat: dict[str, Any] = {}
    for key, value in method.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if "_target_" in value:
                flat[dotted] = _short(str(value["_target_"]))
            flat.update(flatten_method({k: v for k, v in value.items() if k != "_target_"}, f"{dotted}."))
        elif key != "_target_" or prefix:
            flat[dotted] = value
    return {k: v for k, v in flat.items() if k not in _NOT_PARAMS}


@cache
def _defaults(name: str) -> dict[str, Any] | None:
    """The flattened named config ``conf/method/<name>.yaml``; None for a name without one."""
    if not (CONF_DIR / "method" / f"{name}.yaml").is_file():
        return None
    method = compose_config(f"method={name}", "rho=0").method

    return flatten_method(OmegaConf.to_container(method, resolve=True))


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def variant(name: str, params: Mapping[str, Any] | None = None) -> str:
    """The variant label of method ``name`` with ``params`` (dotted keys) set on its named config.

    Only parameters that differ from the named config enter the label, so
    ``variant("inertia", {"aggregator.alpha": 0.8}) == "inertia"``.
    """
    defaults = _defaults(name) or {}
    chosen = {**defaults, **(params or {})}
    differing = sorted(k for k in chosen if _fmt_value(chosen[k]) != _fmt_value(defaults.get(k, _MISSING)))
    if not differing:
        return name
    return f"{name}[{', '.join(f'{k}={_fmt_value(chosen[k])}' for k in differing)}]"


_MISSING = object()


def display(label: str) -> str:
    """A variant label with the paper's method name: ``InertiaKV [aggregator.alpha=0.5]``."""
    name, bracket, rest = label.partition("[")
    return LABELS.get(name, name) + (f" [{rest}" if bracket else "")


def annotate(frame: pd.DataFrame, configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``frame`` with a ``variant`` label and a ``p.<key>`` column per method parameter.

    A run without a config (copied records only) keeps its method name and hash as variant,
    so it never silently stands in for the named default.
    """
    frame = frame.copy()
    labels: dict[str, str] = {}
    params: dict[str, dict[str, Any]] = {}
    for run_id, method, method_hash in (
        frame[["run_id", "method", "method_params"]].drop_duplicates().itertuples(index=False)
    ):
        config = (configs.get(run_id) or {}).get("method")
        if config is None:
            labels[run_id] = f"{method}#{method_hash}"
            params[run_id] = {}
            continue
        flat = flatten_method(config)
        params[run_id] = flat
        labels[run_id] = variant(method, flat) if _defaults(method) is not None else f"{method}#{method_hash}"
    frame["variant"] = frame["run_id"].map(labels)
    for key in sorted({k for p in params.values() for k in p}):
        frame[f"p.{key}"] = frame["run_id"].map(lambda r, key=key: params[r].get(key))
    return frame


# --------------------------------------------------------------------------- the mechanism
@dataclass(frozen=True)
class Scope:
    """What a cell sees besides its records: the table's whole frame and the cell's selection."""

    frame: pd.DataFrame
    where: dict[str, Any]


Cell = Callable[[pd.DataFrame, Scope], str]


@dataclass(frozen=True)
class Line:
    """One row or column: a label, the records it selects, optionally its own cell function.

    ``free`` names selection keys this line ignores when they come from the other axis or
    from its parent lines: the full cache does not depend on rho, so its row takes the
    records of whatever rho it ran at.
    """

    label: str
    where: Mapping[str, Any] = field(default_factory=dict)
    cell: Cell | None = None
    free: tuple[str, ...] = ()


Axis = Callable[[pd.DataFrame], list[Line]]


@dataclass(frozen=True)
class TableSpec:
    """A table: ``rows`` x ``columns`` (axes over the table's records) x ``cell``.

    ``where`` selects the table's records; ``source`` is ``records`` or ``diagnostics``;
    ``presets`` are the ``conf/experiment`` presets whose sweeps fill it.
    """

    key: str
    title: str
    rows: Axis
    columns: Axis
    cell: Cell
    presets: tuple[str, ...]
    where: Mapping[str, Any] = field(default_factory=dict)
    source: str = "records"
    note: str = ""


def fixed(*lines: Line) -> Axis:
    """An axis of the given lines, whatever the records."""
    return lambda _frame: list(lines)


def product(*axes: Axis) -> Axis:
    """Nested axes: each later axis is evaluated on the records its parents select."""

    def lines(frame: pd.DataFrame) -> list[Line]:
        out = [Line("")]
        for axis in axes:
            out = [
                Line(
                    " · ".join(label for label in (parent.label, child.label) if label),
                    {**{k: v for k, v in parent.where.items() if k not in child.free}, **child.where},
                    child.cell or parent.cell,
                    parent.free + child.free,
                )
                for parent in out
                # An axis without values here (no lengths recorded yet) leaves its parent standing.
                for child in axis(_select(frame, parent.where)) or [Line("")]
            ]
        return out

    return lines


def _select(frame: pd.DataFrame, where: Where) -> pd.DataFrame:
    present = {k: v for k, v in where.items() if k in frame.columns}
    if len(present) < len(where):
        # A selection on a column no record carries (a parameter nobody varied) matches nothing.
        return frame.iloc[0:0]
    return select(frame, present)


def models() -> Axis:
    """One line per model with records (rows name the model actually used); none: one unnamed line."""
    return lambda frame: [Line(str(m), {"model": m}) for m in sorted(frame["model"].dropna().unique())] or [Line("")]


def values(column: str, paper: Sequence[Any] = (), fmt: Callable[[Any], str] = str, extra: bool = True) -> Axis:
    """One line per value of ``column``: the paper's values (even when not run) plus those present."""

    def lines(frame: pd.DataFrame) -> list[Line]:
        present = frame[column].dropna().unique().tolist() if column in frame.columns and extra else []
        chosen = list(dict.fromkeys([*paper, *sorted(present, key=lambda v: (str(type(v)), v))]))
        return [Line(fmt(v), {column: v}) for v in chosen]

    return lines


def subtasks(average: bool = True) -> Axis:
    """One line per subtask present, then their average (no subtask selected)."""

    def lines(frame: pd.DataFrame) -> list[Line]:
        names = sorted(frame["subtask"].dropna().unique().tolist())
        out = [Line(str(s), {"subtask": s}) for s in names]
        return [*out, Line(AVERAGE)] if average and len(names) != 1 else out

    return lines


def methods(names: Sequence[str], others: bool = True, free_rho: Sequence[str] = ("full",)) -> Axis:
    """The named methods (default configs), then any other default-config method present.

    Methods in ``free_rho`` (the full cache) ignore the rho of the other axis.
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        chosen = list(names)
        if others and "variant" in frame.columns:
            present = frame.loc[frame["variant"] == frame["method"], "variant"].unique().tolist()
            chosen += sorted(v for v in present if v not in chosen)
        return [Line(display(n), {"variant": n}, free=("rho",) if n in free_rho else ()) for n in dict.fromkeys(chosen)]

    return lines


def _merge(row: Line, column: Line) -> dict[str, Any]:
    where = {k: v for k, v in column.where.items() if k not in row.free}
    where.update({k: v for k, v in row.where.items() if k not in column.free})
    return where


def _one_per_example(records: pd.DataFrame) -> pd.DataFrame:
    """At most one record per example: the full cache run at several rho counts once."""
    if records.empty:
        return records
    duplicated = records.duplicated(list(PAIR_KEY), keep=False)
    if duplicated.any():
        kinds = sorted(records.loc[duplicated, "variant"].unique()) if "variant" in records else []
        if any(k != "full" for k in kinds):
            log.warning("a cell selects several records per example (%s): keeping the lowest rho", kinds)
        records = records.sort_values("rho").drop_duplicates(list(PAIR_KEY), keep="first")
    return records


def benchmark_mean(records: pd.DataFrame, metric: str) -> float:
    """Mean over subtasks of the subtask means (the papers' benchmark average); NaN without values."""
    valid = records[records[metric].notna()] if metric in records.columns else records.iloc[0:0]
    if valid.empty:
        return math.nan
    return float(valid.groupby(valid["subtask"].fillna(""))[metric].mean().mean())


def mean(metric: str = "score", scale: float = 1.0, digits: int = 1) -> Cell:
    """Cell: ``scale`` x the benchmark mean of ``metric``."""

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        value = benchmark_mean(_one_per_example(records), metric)
        return NOT_RUN if math.isnan(value) else f"{scale * value:.{digits}f}"

    return cell


def adaptation(records: pd.DataFrame, scope: Scope) -> str:
    """Cell: mean turns to adapt after a topic shift, and the share of shifts never adapted."""
    records = _one_per_example(records)
    speed = benchmark_mean(records, "metric.adaptation")
    if math.isnan(speed):
        return NOT_RUN
    never = benchmark_mean(records, "metric.adaptation_never")
    return f"{speed:.2f} ({100 * never:.0f}%)"


def paired(baseline: Where, candidate: Where, part: str, metric: str = "score", digits: int = 1) -> Cell:
    """Cell: candidate minus baseline on shared examples, ``part`` ``diff`` (mean and 95% CI) or ``p``.

    Both sides are the cell's selection with ``baseline`` / ``candidate`` laid over it; the
    statistics are ``harness.stats.compare`` over all shared examples of the cell.
    """
    memo: dict[tuple[int, str], pd.Series | None] = {}

    def comparison(scope: Scope) -> pd.Series | None:
        key = (id(scope.frame), repr(sorted(scope.where.items(), key=str)))
        if key not in memo:
            base = _one_per_example(_select(scope.frame, {**scope.where, **baseline}))
            cand = _one_per_example(_select(scope.frame, {**scope.where, **candidate}))
            both = pd.concat([base.assign(_side="a"), cand.assign(_side="b")])
            result = None
            if not base.empty and not cand.empty:
                row = compare(both, {"_side": "a"}, {"_side": "b"}, metric=metric, by=[]).iloc[0]
                result = row if row["n"] > 0 else None
            memo[key] = result
        return memo[key]

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        row = comparison(scope)
        if row is None:
            return NOT_RUN
        if part == "p":
            p = row["p_value"]
            return "n/a" if math.isnan(p) else ("<1e-4" if p < 1e-4 else f"{p:.3f}")
        d = digits
        return f"{row['mean_diff']:+.{d}f} [{row['ci_low']:+.{d}f}, {row['ci_high']:+.{d}f}] (n={int(row['n'])})"

    return cell


def relative_to_full(metric: str = "score", digits: int = 1) -> Cell:
    """Cell: the mean as a percentage of the full cache's mean on the same examples."""

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        records = _one_per_example(records)
        if records.empty:
            return NOT_RUN
        where = {k: v for k, v in scope.where.items() if k not in ("variant", "rho", "method")}
        full = _one_per_example(_select(scope.frame, {**where, "variant": "full"}))
        shared = records.merge(full[[*PAIR_KEY, metric]], on=list(PAIR_KEY), suffixes=("", "_full"))
        reference = benchmark_mean(shared.assign(**{metric: shared[f"{metric}_full"]}), metric)
        if math.isnan(reference):
            return "no full-cache run"
        if reference == 0:
            return "full = 0"
        return f"{100 * benchmark_mean(shared, metric) / reference:.{digits}f}%"

    return cell


# --------------------------------------------------------------------------- rendering
def grid(spec: TableSpec, frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The table as a header and rows of strings (first column: the row labels)."""
    frame = _select(frame, spec.where) if spec.where else frame
    rows, columns = spec.rows(frame), spec.columns(frame)
    body = []
    for row in rows:
        cells = []
        for column in columns:
            where = _merge(row, column)
            cell = column.cell or row.cell or spec.cell
            cells.append(cell(_select(frame, where), Scope(frame, where)))
        body.append([row.label or "—", *cells])
    return ["", *(c.label for c in columns)], body


def to_markdown(header: list[str], body: list[list[str]]) -> str:
    """A GitHub Markdown table (pipes inside cells escaped)."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join(["---"] * len(header)) + "|", *(line(r) for r in body)])


_LATEX_SPECIAL = {c: f"\\{c}" for c in "&%$#_{}"}
_LATEX_UNICODE = {
    "ρ": r"$\rho$",
    "α": r"$\alpha$",
    "γ": r"$\gamma$",
    "Δ": r"$\Delta$",
    "µ": r"$\mu$",
    "·": r"$\cdot$",
    "≥": r"$\geq$",
    "—": "--",
}


def latex_escape(text: str) -> str:
    """``text`` safe inside a LaTeX table cell (pdflatex: Greek letters become math)."""
    out = text.replace("\\", r"\textbackslash{}")
    for char, escaped in _LATEX_SPECIAL.items():
        out = out.replace(char, escaped)
    out = out.replace("~", r"\textasciitilde{}").replace("^", r"\textasciicircum{}").replace("<", r"\textless{}")
    for char, math_mode in _LATEX_UNICODE.items():
        out = out.replace(char, math_mode)
    return out


def to_latex(header: list[str], body: list[list[str]], caption: str, label: str) -> str:
    """A booktabs ``table`` environment."""
    row = lambda cells: " & ".join(latex_escape(c) for c in cells) + r" \\"  # noqa: E731
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(caption)}}}",
            rf"\label{{tab:{label}}}",
            r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
            r"\toprule",
            row(header),
            r"\midrule",
            *(row(r) for r in body),
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
            "",
        ]
    )


# --------------------------------------------------------------------------- the papers' tables
def _pct(rho: float) -> str:
    return f"ρ={rho:g}"


def _named(name: str) -> tuple[str, Where]:
    """A named method's default variant as (label, selection)."""
    return display(name), {"variant": name}


def _diff_columns(baseline: tuple[str, Where], candidate: tuple[str, Where]) -> Axis:
    """Baseline mean, candidate mean, candidate minus baseline with its 95% CI, and p."""
    (a_label, a), (b_label, b) = baseline, candidate
    return fixed(
        Line(a_label, a),
        Line(b_label, b),
        Line("Δ [95% CI]", cell=paired(a, b, "diff")),
        Line("p", cell=paired(a, b, "p")),
    )


def _present_variants(frame: pd.DataFrame) -> list[Line]:
    return [Line(display(v), {"variant": v}) for v in sorted(frame["variant"].dropna().unique())]


def _dialog_scenarios() -> list[str]:
    from tasks.dialogs.world import SCENARIOS

    return list(SCENARIOS)


def _shifting_scenarios() -> list[str]:
    from tasks.dialogs.world import SCENARIOS

    return [name for name, spec in SCENARIOS.items() if spec.shifts()]


_BASELINES = ("full", "streaming_llm", "h2o", "tova", "snapkv", "inertia")
_DIALOG_METHODS = ("fifo", "sink_window", "h2o", "fdkvc")
_SCORERS = ("attention", "vnorm", "entropy", "keydiff", "keynorm", "recency", "random")
_ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95)
_W_C = (0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
_GAMMAS = (0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.95)
_TRANSFER = {"attention": "TOVA (attention)", "keydiff": "KeyDiff", "keynorm": "KNorm"}
_EMA = {"p.aggregator": "ema", "p.aggregator.alpha": 0.8}
_KVPOP_METHODS = ("full", "streaming_llm", "h2o", "tova", "snapkv", "inertia", "kvpop", "kvpop_mlp")

#: Diagnostic summaries (``harness.diagnostics.SUMMARY``) and their column labels.
DIAGNOSTIC_COLUMNS: dict[str, str] = {
    "churn": "top-B churn",
    "jaccard_raw_state": "raw/EMA Jaccard",
    "raw_top_evicted": "raw-top evicted",
    "spearman_vs_attention": "Spearman vs attn",
    "jaccard_vs_attention": "top-B Jaccard vs attn",
}


def _scenario_columns(total: str, extra: Sequence[Line] = ()) -> Axis:
    return fixed(*(Line(s, {"subtask": s}) for s in _dialog_scenarios()), Line(total), *extra)


def _variant_axis(name: str, key: str, grid_values: Sequence[float], label: str, pair: Callable | None = None) -> Axis:
    """Variants of ``name`` along one parameter: the paper's grid plus any other value run.

    ``pair`` adds the parameters tied to it (FD-KVC's w_rho = 1 - w_c).
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        column = f"p.{key}"
        present = frame.loc[frame["method"] == name, column].dropna() if column in frame.columns else []
        chosen = sorted({*grid_values, *(float(v) for v in present)})
        return [
            Line(f"{label}={v:g}", {"variant": variant(name, {key: v, **(pair(v) if pair else {})})}) for v in chosen
        ]

    return lines


def paper_tables() -> list[TableSpec]:
    """Every table ``make tables`` writes, in paper order."""
    ruler = {"task": "ruler"}
    lengths = values("meta.length", fmt=lambda n: f"{int(n) // 1024}k" if n >= 1024 else str(int(n)))
    return [
        TableSpec(
            "inertia_table1",
            "InertiaKV Table 1: RULER average (%) per context length and eviction ratio ρ",
            product(models(), methods(_BASELINES)),
            product(lengths, values("rho", PAPER_RHOS, _pct, extra=False)),
            mean(),
            ("inertia_table1", "inertia_table1_cpu"),
            where=ruler,
        ),
        TableSpec(
            "inertia_table2",
            "InertiaKV Table 2: scorer ablation under EMA (α=0.8), RULER average (%)",
            product(models(), fixed(*(Line(s, {"variant": variant("inertia", {"scorer": s})}) for s in _SCORERS))),
            values("rho", PAPER_RHOS, _pct),
            mean(),
            ("inertia_table2", "inertia_table2_cpu"),
            where=ruler,
        ),
        TableSpec(
            "inertia_table3",
            "InertiaKV Table 3: Score-Free vs full refresh per LongBench task, ρ=0.9 (paired bootstrap CI, t-test p)",
            product(models(), subtasks()),
            _diff_columns(_named("inertia"), _named("score_free")),
            mean(),
            ("inertia_table3", "inertia_table3_cpu"),
            where={"task": "longbench", "rho": 0.9},
        ),
        TableSpec(
            "inertia_table4",
            "InertiaKV Table 4: baselines at ρ=0.9 on LongBench",
            product(models(), values("rho", (0.9,), _pct, extra=False), methods(_BASELINES)),
            subtasks(),
            mean(),
            ("inertia_table4", "inertia_table4_cpu"),
            where={"task": "longbench"},
        ),
        TableSpec(
            "inertia_table5",
            "InertiaKV Table 5: EMA α sweep (α=0: single-step), RULER, ρ=0.9",
            product(models(), _variant_axis("inertia", "aggregator.alpha", _ALPHAS, "α")),
            subtasks(),
            mean(),
            ("inertia_table5", "inertia_table5_cpu"),
            where={**ruler, "rho": 0.9},
        ),
        TableSpec(
            "inertia_table11",
            "InertiaKV Table 11: EMA transfer to other scorers in TOVA's per-layer framework, RULER average",
            product(
                models(),
                values("rho", PAPER_RHOS, _pct),
                fixed(*(Line(label, {"method": "tova", "p.scorer": s}) for s, label in _TRANSFER.items())),
            ),
            _diff_columns(("single-step", {"p.aggregator": "single"}), ("EMA α=0.8", _EMA)),
            mean(),
            ("inertia_table11", "inertia_table11_cpu"),
            where=ruler,
        ),
        TableSpec(
            "inertia_table12",
            "InertiaKV Table 12: cumulative minus EMA on RULER (paired bootstrap CI)",
            product(models(), values("rho", PAPER_RHOS, _pct), subtasks()),
            _diff_columns(_named("inertia"), _named("cumulative")),
            mean(),
            ("inertia_table12", "inertia_table12_cpu"),
            where=ruler,
        ),
        TableSpec(
            "inertia_table13",
            "InertiaKV Table 13: rank-trace diagnostics (per-step means over decode steps and examples)",
            product(models(), _present_variants),
            fixed(*(Line(label, cell=mean(f"metric.{key}", digits=3)) for key, label in DIAGNOSTIC_COLUMNS.items())),
            mean(),
            ("inertia_table13", "inertia_table13_cpu"),
            source="diagnostics",
        ),
        TableSpec(
            "inertia_table14",
            "InertiaKV Table 14: Lazy-4 minus InertiaKV (paired bootstrap CI)",
            product(models(), values("task"), values("rho", PAPER_RHOS, _pct), subtasks()),
            _diff_columns(_named("inertia"), _named("inertia_lazy")),
            mean(),
            ("inertia_table14", "inertia_table14_cpu"),
        ),
        TableSpec(
            "fdkvc_table1",
            "FD-KVC Table 1: late-turn alignment per scenario and composite",
            product(models(), methods(_DIALOG_METHODS)),
            _scenario_columns("composite"),
            mean("metric.alignment", digits=3),
            ("fdkvc_tables", "fdkvc_tables_cpu"),
            where={"task": "dialogs"},
        ),
        TableSpec(
            "fdkvc_table2",
            "FD-KVC Table 2: adaptation speed, turns to 80% retention after a shift (share never adapted)",
            product(models(), methods(_DIALOG_METHODS)),
            fixed(*(Line(s, {"subtask": s}) for s in _shifting_scenarios()), Line("mean")),
            adaptation,
            ("fdkvc_tables", "fdkvc_tables_cpu"),
            where={"task": "dialogs", "subtask": _shifting_scenarios()},
        ),
        TableSpec(
            "fdkvc_table3",
            "FD-KVC Table 3: late diversity (% of the dialog's topics with a cached token)",
            product(models(), methods(_DIALOG_METHODS)),
            _scenario_columns("mean"),
            mean("metric.diversity", scale=100),
            ("fdkvc_tables", "fdkvc_tables_cpu"),
            where={"task": "dialogs"},
        ),
        TableSpec(
            "fdkvc_table4",
            "FD-KVC Table 4: late retention (% of cache on the current topic) and method latency",
            product(models(), methods(_DIALOG_METHODS)),
            _scenario_columns("mean", [Line("latency µs/turn", cell=mean("metric.latency_ms_per_turn", 1000))]),
            mean("metric.retention", scale=100),
            ("fdkvc_tables", "fdkvc_tables_cpu"),
            where={"task": "dialogs"},
        ),
        TableSpec(
            "fdkvc_table5",
            "FD-KVC Table 5: w_c ablation (w_ρ = 1 - w_c), alignment on mixed",
            product(models(), _variant_axis("fdkvc", "w_c", _W_C, "w_c", lambda v: {"w_rho": round(1 - v, 6)})),
            fixed(Line("alignment (mixed)", {"subtask": "mixed"})),
            mean("metric.alignment", digits=4),
            ("fdkvc_table5", "fdkvc_table5_cpu"),
            where={"task": "dialogs"},
        ),
        TableSpec(
            "fdkvc_table6",
            "FD-KVC Table 6: γ ablation, alignment on mixed",
            product(models(), _variant_axis("fdkvc", "gamma", _GAMMAS, "γ")),
            fixed(Line("alignment (mixed)", {"subtask": "mixed"})),
            mean("metric.alignment", digits=4),
            ("fdkvc_table6", "fdkvc_table6_cpu"),
            where={"task": "dialogs"},
        ),
        *(
            TableSpec(
                f"kvpop_table{number}",
                f"KVpop Table {number}: {what} at 75% and 88% eviction",
                product(models(), methods(_KVPOP_METHODS)),
                product(values("task", ("aime", "hmmt")), values("rho", KVPOP_RHOS, _pct, extra=False)),
                cell,
                ("kvpop_tables", "kvpop_tables_cpu"),
                where={"task": ["aime", "hmmt", "ruler", "longbench", "longbench_v2"]},
            )
            for number, what, cell in (
                (1, "score", mean()),
                (2, "score relative to the full cache", relative_to_full()),
            )
        ),
    ]


# --------------------------------------------------------------------------- output
def _count(body: list[list[str]]) -> tuple[int, int]:
    cells = [c for row in body for c in row[1:]]
    return sum(c != NOT_RUN for c in cells), len(cells)


def write_tables(root: Path | str = "results", out: Path | str | None = None) -> list[Path]:
    """Write every table of ``paper_tables()`` from the records under ``root``; returns the files written.

    ``out`` defaults to ``<root>/tables``. ``index.md`` lists each table, how many cells hold
    a value, and the presets (with their commands) that fill it.
    """
    from harness.diagnostics import load_diagnostics

    root = Path(root)
    out = Path(out) if out is not None else root / "tables"
    out.mkdir(parents=True, exist_ok=True)
    configs = load_configs(root)
    frames = {
        "records": annotate(load_results(root), configs),
        "diagnostics": annotate(load_diagnostics(root), configs),
    }
    written: list[Path] = []
    index = [
        "# Paper tables",
        "",
        f"Generated by `python -m harness.tables {root}` from the records under `{root}/`.",
        "Cells without records say \u201cnot run\u201d; the presets below fill them.",
        "",
        "| table | filled cells | presets (cluster, CPU) |",
        "|---|---|---|",
    ]
    for spec in paper_tables():
        header, body = grid(spec, frames[spec.source])
        filled, total = _count(body)
        md = out / f"{spec.key}.md"
        md.write_text(f"## {spec.title}\n\n{to_markdown(header, body)}\n" + (f"\n{spec.note}\n" if spec.note else ""))
        tex = out / f"{spec.key}.tex"
        tex.write_text(to_latex(header, body, spec.title, spec.key))
        written += [md, tex]
        commands = ", ".join(f"`python -m harness.run -m +experiment={p}`" for p in spec.presets)
        index.append(f"| [{spec.key}]({spec.key}.md) | {filled}/{total} | {commands} |")
        log.info("%s: %d of %d cells filled", spec.key, filled, total)
    (out / "index.md").write_text("\n".join(index) + "\n")
    written.append(out / "index.md")
    return written


def main(argv: list[str]) -> None:
    """Tables, then figures, from ``argv[0]`` (default ``results``)."""
    from harness.plots import make_figures
    from harness.report import existing_root

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = existing_root(argv)
    with user_errors():
        written = write_tables(root)
        log.info("tables: %d files in %s", len(written), root / "tables")
        figures = make_figures(root)
    log.info("figures: %s", ", ".join(p.name for p in figures) or "none (no data for any figure)")


if __name__ == "__main__":
    cli(lambda: main(sys.argv[1:]))
