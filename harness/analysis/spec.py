"""The table language: a table is rows x columns x a cell function over the loaded records.

A row and a column are each a ``Line`` (a label and a record selection); a cell is the cell
function applied to the records both select. Tables differ only in their spec: which lines,
which cell (a mean, a paired difference with its bootstrap CI, a p-value, a ratio to the full
cache). Cells whose selection holds no record say "not run", so a table exists (and shows
what is missing) from the first run on.

What every table reads the same way (``grid``): the runs of its preset (its seed,
``harness.analysis.presets``), and within them only the examples every configuration of the table
recorded (``harness.analysis.shared``), so that no two cells average different samples. Each cell
covers some number n of examples; the table's note gives the n most of its cells share, and a cell
over another n says so after its value, ``(n=…)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.analysis.presets import preset_seed
from harness.analysis.results import one_batch_size
from harness.analysis.shared import count_examples, shared_examples
from harness.analysis.stats import PAIR_KEY, select, stratified_paired_bootstrap
from harness.analysis.variants import display, variant
from harness.record.files import DuplicateRecordError

NOT_RUN = "not run"
AVERAGE = "average"

Where = Mapping[str, Any]


@dataclass(frozen=True)
class Scope:
    """What a cell sees besides its records: the table's frame (its preset's runs, the examples its
    configurations share) and the cell's selection."""

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


def chain(*axes: Axis) -> Axis:
    """Axes side by side: the lines of each, in order."""
    return lambda frame: [line for axis in axes for line in axis(frame)]


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
    a model that ran other tables' configurations does not add a row of "not run". Where it selects
    nothing yet and several models have records in the table's frame, each has its line: one unnamed
    line would put several models' records in one cell.
    """

    def lines(frame: pd.DataFrame) -> list[Line]:
        chosen = _select(frame, within) if within else frame
        if chosen.empty and frame["model"].nunique() > 1:
            chosen = frame
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
    variants (another dtype, another batch size) or two task protocols (another generation limit,
    another truncation), is an error naming the runs: keeping either would make the cell depend on
    which folder sorted first.
    """
    if records.empty:
        return records
    duplicated = records.duplicated(list(PAIR_KEY), keep=False)
    if duplicated.any():
        clash = records[duplicated]
        groups = clash.groupby(list(PAIR_KEY), dropna=False)
        differing = [
            (groups[column].nunique(dropna=False) > 1).any()
            for column in ("model_params", "task_params")
            if column in clash
        ]
        if ("variant" in clash and (clash["variant"] != "full").any()) or any(differing):
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


def relative_to_full(metric: str = "score", digits: int = 2) -> Cell:
    """Cell: the mean over the full cache's mean on the same examples, a ratio (KVpop's Rel: 0.98)."""

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
        return f"{benchmark_mean(shared, metric) / reference:.{digits}f}"

    return cell


@dataclass(frozen=True)
class Grid:
    """A table as strings: the header, the rows (first column: the row labels) and the note on its sample."""

    header: list[str]
    body: list[list[str]]
    note: str


def grid(spec: TableSpec, frame: pd.DataFrame) -> Grid:
    """The table as strings, every cell over the examples its table's configurations share (its n noted)."""
    frame = _select(frame, {**spec.where, "seed": preset_seed(spec.preset)})
    if spec.timings:
        one_batch_size(frame, f"table {spec.key}")
    rows, columns = spec.rows(frame), spec.columns(frame)
    wheres = [[_merge(row, column) for column in columns] for row in rows]
    frame = shared_examples(frame, [(where, _select(frame, where)) for line in wheres for where in line])
    texts: list[list[str]] = []
    counts: list[list[int]] = []
    for row, line in zip(rows, wheres, strict=True):
        texts.append([])
        counts.append([])
        for column, where in zip(columns, line, strict=True):
            records, scope = _select(frame, where), Scope(frame, where)
            cell = column.cell or row.cell or spec.cell
            texts[-1].append(cell(records, scope))
            # A cell that names its sample itself (a correlation's "(n=…)") is left to say so; one computed over
            # fewer examples than its records cover (a paired difference: those both sides share) gives its n.
            said = texts[-1][-1] == NOT_RUN or "n=" in texts[-1][-1]
            sample = getattr(cell, "sample", None)
            counts[-1].append(0 if said else sample(scope) if sample else count_examples(records))
    sample = _sample_sizes(counts)
    header = ["", *(_with_n(c.label, n) for c, n in zip(columns, sample.columns, strict=True))]
    body = [
        [
            _with_n(row.label or "—", sample.rows[i]),
            *(_with_n(t, n) for t, n in zip(texts[i], sample.cells[i], strict=True)),
        ]
        for i, row in enumerate(rows)
    ]
    note = (
        f"Each cell is computed over the examples that every configuration of the table recorded for its model and"
        f" benchmark: n = {sample.nominal} example{'s' * (sample.nominal > 1)} per cell, unless its column, its row"
        " or the cell itself names another n."
        if sample.nominal
        else ""
    )
    return Grid(header, body, note)


@dataclass(frozen=True)
class _SampleSizes:
    """Where a table says its n: the note (``nominal``), a column header, a row label, or a cell (0: nowhere)."""

    nominal: int
    columns: list[int]
    rows: list[int]
    cells: list[list[int]]


def _sample_sizes(counts: list[list[int]]) -> _SampleSizes:
    """The most common n goes into the note; a column whose filled cells all share another n says it in its
    header, then a row whose remaining filled cells do in its label; any cell left over says its own."""
    filled = pd.Series([n for line in counts for n in line if n])
    if filled.empty:
        return _SampleSizes(0, [0] * len(counts[0]) if counts else [], [0] * len(counts), counts)
    nominal = int(filled.value_counts().sort_index(ascending=False).idxmax())

    def other(values: list[int]) -> int:
        found = {n for n in values if n}
        return found.pop() if len(found) == 1 and nominal not in found else 0

    columns = [other([line[j] for line in counts]) for j in range(len(counts[0]))]
    rows = [other([n for n, told in zip(line, columns, strict=True) if not told]) for line in counts]
    cells = [
        [n if n not in (0, nominal) and not columns[j] and not rows[i] else 0 for j, n in enumerate(line)]
        for i, line in enumerate(counts)
    ]
    return _SampleSizes(nominal, columns, rows, cells)


def _with_n(text: str, n: int) -> str:
    return f"{text} (n={n})" if n else text


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


def delta(
    baseline: Where, candidate: Where, show: str = "ci", metric: str = "score", digits: int | None = None
) -> Cell:
    """Cell: candidate minus baseline on shared examples, averaged over subtasks as ``score`` averages.

    The difference of a cell spanning several subtasks is the mean over subtasks of their mean
    differences (so it equals the difference of the two ``score`` cells on the shared examples),
    with a 95% interval from 10,000 resamples within each subtask (seed 0) and a stratified
    t-test p (``harness.analysis.stats.stratified_paired_bootstrap``). ``show``: ``ci`` (the
    difference and its interval), ``mean`` (the difference alone) or ``p``; ``digits``: decimals
    (None: the paper's for the benchmark, ``paper_digits``).
    """
    memo: dict[tuple[int, str], Any] = {}

    def comparison(scope: Scope) -> tuple[Any, int, int] | None:
        key = (id(scope.frame), repr(sorted(scope.where.items(), key=str)))
        if key not in memo:
            pairs = _paired_records(scope, baseline, candidate, metric)
            memo[key] = (
                (
                    stratified_paired_bootstrap(pairs["a"], pairs["b"], pairs["subtask"]),
                    paper_digits(pairs) if digits is None else digits,
                    len(pairs),
                )
                if len(pairs)
                else None
            )
        return memo[key]

    def cell(records: pd.DataFrame, scope: Scope) -> str:
        result = comparison(scope)
        if result is None:
            return NOT_RUN
        stats, places, _ = result
        if show == "p":
            return "n/a" if math.isnan(stats.p_value) else ("<1e-4" if stats.p_value < 1e-4 else f"{stats.p_value:.3f}")
        if show == "mean":
            return f"{stats.mean_diff:+.{places}f}"
        return f"{stats.mean_diff:+.{places}f} [{stats.ci_low:+.{places}f}, {stats.ci_high:+.{places}f}]"

    def sample(scope: Scope) -> int:
        result = comparison(scope)
        return 0 if result is None else result[2]

    cell.sample = sample  # type: ignore[attr-defined]
    return cell
