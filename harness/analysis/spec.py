"""The table language: a table is rows x columns x a cell function over the loaded records.

A row and a column are each a ``Line`` (a label and a record selection); a cell is the cell
function applied to the records both select. Tables differ only in their spec: which lines,
which cell (a mean, a paired difference with its bootstrap CI, a p-value, a ratio to the full
cache). Cells whose selection holds no record say "not run", so a table exists (and shows
what is missing) from the first run on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.analysis.results import one_batch_size
from harness.analysis.stats import PAIR_KEY, compare, select, stratified_paired_bootstrap
from harness.analysis.variants import display, variant
from harness.record.files import DuplicateRecordError

NOT_RUN = "not run"
AVERAGE = "average"

Where = Mapping[str, Any]


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
    ``preset`` is the ``conf/experiment`` preset whose sweep fills it (``scale=cpu``: its CPU form).
    A table with ``timings`` compares timings across its cells, so its records must all have been
    decoded at one batch size (``harness.analysis.results.one_batch_size``).
    """

    key: str
    title: str
    rows: Axis
    columns: Axis
    cell: Cell
    preset: str
    where: Mapping[str, Any] = field(default_factory=dict)
    source: str = "records"
    note: str = ""
    timings: bool = False


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


def restrict(frame: pd.DataFrame, where: Where) -> pd.DataFrame:
    """The records of ``frame`` that ``where`` selects (none when it names a column no record has)."""
    return _select(frame, where)


def models(within: Where | None = None) -> Axis:
    """One line per model with records (rows name the model actually used); none: one unnamed line.

    ``within`` counts only the models whose records it selects (a table's distinctive runs), so
    a model that ran other tables' configurations does not add a row of "not run".
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        chosen = _select(frame, within) if within else frame
        return [Line(str(m), {"model": m}) for m in sorted(chosen["model"].dropna().unique())] or [Line("")]

    return lines


def values(
    column: str,
    paper: Sequence[Any] = (),
    fmt: Callable[[Any], str] = str,
    extra: bool = True,
    within: Where | None = None,
) -> Axis:
    """One line per value of ``column``: the paper's values (even when not run) plus those present.

    ``within`` counts only the values of the records it selects.
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        source = _select(frame, within) if within else frame
        present = source[column].dropna().unique().tolist() if column in source.columns and extra else []
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


def one_per_example(records: pd.DataFrame) -> pd.DataFrame:
    """At most one record per example: the full cache run at several rho counts once.

    Any other method selected twice for one example (two runs one label cannot tell apart, such
    as a learned scorer with two checkpoints for one model), and the full cache run under two model
    variants (another dtype, another batch size), is an error naming the runs: keeping either would
    make the cell depend on which folder sorted first.
    """
    if records.empty:
        return records
    duplicated = records.duplicated(list(PAIR_KEY), keep=False)
    if duplicated.any():
        clash = records[duplicated]
        variants = (
            clash.groupby(list(PAIR_KEY), dropna=False)["model_params"].nunique(dropna=False)
            if "model_params" in clash
            else pd.Series(dtype=int)
        )
        if ("variant" in clash and (clash["variant"] != "full").any()) or (variants > 1).any():
            runs = sorted(clash["run_id"].unique())
            example = clash.iloc[0]["example_id"]
            raise DuplicateRecordError(
                f"one table cell selects several records of example {example!r}, from runs {', '.join(runs)}"
                " — move the stale run folder out of the results root"
            )
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
        value = benchmark_mean(one_per_example(records), metric)
        return NOT_RUN if math.isnan(value) else f"{scale * value:.{digits}f}"

    return cell


def paired(baseline: Where, candidate: Where, part: str, metric: str = "score", digits: int = 1) -> Cell:
    """Cell: candidate minus baseline on shared examples, ``part`` ``diff`` (mean and 95% CI) or ``p``.

    Both sides are the cell's selection with ``baseline`` / ``candidate`` laid over it; the
    statistics are ``harness.analysis.stats.compare`` over all shared examples of the cell.
    """
    memo: dict[tuple[int, str], pd.Series | None] = {}

    def comparison(scope: Scope) -> pd.Series | None:
        key = (id(scope.frame), repr(sorted(scope.where.items(), key=str)))
        if key not in memo:
            base = one_per_example(_select(scope.frame, {**scope.where, **baseline}))
            cand = one_per_example(_select(scope.frame, {**scope.where, **candidate}))
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
        records = one_per_example(records)
        if records.empty:
            return NOT_RUN
        # The full cache has no method parameters (p.*): a row's budget does not apply to it.
        where = {
            k: v for k, v in scope.where.items() if k not in ("variant", "rho", "method") and not k.startswith("p.")
        }
        full = one_per_example(_select(scope.frame, {**where, "variant": "full"}))
        shared = records.merge(full[[*PAIR_KEY, metric]], on=list(PAIR_KEY), suffixes=("", "_full"))
        reference = benchmark_mean(shared.assign(**{metric: shared[f"{metric}_full"]}), metric)
        if math.isnan(reference):
            return "no full-cache run"
        if reference == 0:
            return "full = 0"
        return f"{100 * benchmark_mean(shared, metric) / reference:.{digits}f}%"

    return cell


def grid(spec: TableSpec, frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The table as a header and rows of strings (first column: the row labels)."""
    frame = _select(frame, spec.where) if spec.where else frame
    if spec.timings:
        one_batch_size(frame, f"table {spec.key}")
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


def rho_label(rho: float) -> str:
    return f"ρ={rho:g}"


def named(name: str) -> tuple[str, Where]:
    """A named method's default variant as (label, selection)."""
    return display(name), {"variant": name}


def variant_axis(name: str, key: str, grid_values: Sequence[float], label: str, pair: Callable | None = None) -> Axis:
    """Variants of ``name`` along one parameter: the paper's grid plus any other value run.

    ``pair`` adds the parameters tied to it (FD-KVC's w_recency = 1 - w_c).
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        column = f"p.{key}"
        present = frame.loc[frame["method"] == name, column].dropna() if column in frame.columns else []
        chosen = sorted({*grid_values, *(float(v) for v in present)})
        return [
            Line(f"{label}={v:g}", {"variant": variant(name, {key: v, **(pair(v) if pair else {})})}) for v in chosen
        ]

    return lines


# --------------------------------------------------------------------------- cells in a paper's own units
def paper_digits(records: pd.DataFrame) -> int:
    """Decimals as the InertiaKV paper writes them: LongBench-v2 accuracy on 0-1 with 3, others on 0-100 with 2."""
    return 3 if not records.empty and (records["task"] == "longbench_v2").all() else 2


def score(metric: str = "score") -> Cell:
    """Cell: the benchmark mean (mean of subtask means) in the paper's units and decimals."""

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        records = one_per_example(records)
        value = benchmark_mean(records, metric)
        return NOT_RUN if math.isnan(value) else f"{value:.{paper_digits(records)}f}"

    return cell


def _paired_records(scope: Scope, baseline: Where, candidate: Where, metric: str) -> pd.DataFrame:
    """Examples both sides recorded (with a value): columns subtask, task, ``a`` and ``b``."""
    base = one_per_example(_select(scope.frame, {**scope.where, **baseline}))
    cand = one_per_example(_select(scope.frame, {**scope.where, **candidate}))
    if base.empty or cand.empty:
        return pd.DataFrame(columns=["subtask", "task", "a", "b"])
    merged = base[[*PAIR_KEY, metric]].merge(cand[[*PAIR_KEY, metric]], on=list(PAIR_KEY), suffixes=("_a", "_b"))
    merged = merged.rename(columns={f"{metric}_a": "a", f"{metric}_b": "b"}).dropna(subset=["a", "b"])
    return merged.assign(subtask=merged["subtask"].fillna(""))


def delta(baseline: Where, candidate: Where, show: str = "ci", metric: str = "score") -> Cell:
    """Cell: candidate minus baseline on shared examples, averaged over subtasks as ``score`` averages.

    The difference of a cell spanning several subtasks is the mean over subtasks of their mean
    differences (so it equals the difference of the two ``score`` cells on the shared examples),
    with a 95% interval from 10,000 resamples within each subtask (seed 0) and a stratified
    t-test p (``harness.analysis.stats.stratified_paired_bootstrap``). ``show``: ``ci`` (the
    difference and its interval), ``mean`` (the difference alone) or ``p``.
    """
    memo: dict[tuple[int, str], Any] = {}

    def comparison(scope: Scope) -> tuple[Any, int] | None:
        key = (id(scope.frame), repr(sorted(scope.where.items(), key=str)))
        if key not in memo:
            pairs = _paired_records(scope, baseline, candidate, metric)
            memo[key] = (
                (stratified_paired_bootstrap(pairs["a"], pairs["b"], pairs["subtask"]), paper_digits(pairs))
                if len(pairs)
                else None
            )
        return memo[key]

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        result = comparison(scope)
        if result is None:
            return NOT_RUN
        stats, digits = result
        if show == "p":
            return "n/a" if math.isnan(stats.p_value) else ("<1e-4" if stats.p_value < 1e-4 else f"{stats.p_value:.3f}")
        if show == "mean":
            return f"{stats.mean_diff:+.{digits}f}"
        return f"{stats.mean_diff:+.{digits}f} [{stats.ci_low:+.{digits}f}, {stats.ci_high:+.{digits}f}]"

    return cell
