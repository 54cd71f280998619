"""The examples a table's cells are computed over: those every configuration of the table recorded.

A table compares configurations (methods, budgets, alphas, readings): a cell's configuration is the
part of its selection that says *what ran* (``variant``, ``method``, ``rho``, a method parameter
``p.*``); the rest says *on what* (model, task, subtask, length, ...). Two runs of a table's
configurations rarely hold the same examples: a sweep was interrupted, a larger run of one
configuration was made by another preset (FD-KVC's default ``w_c`` holds ``fdkvc_tables``' 600
dialogs beside Table 5's 200), a method failed on part of a benchmark. Averaging each cell over
whatever its runs hold would compare means over different samples.

So within a table, an example counts only if every configuration of the table that recorded
anything in the example's *universe* (its model and task: the row group of a model, one benchmark)
recorded it too. Configurations that never ran on that benchmark do not shrink it (their cells say
"not run"), and examples of different models or benchmarks never meet. Every cell that covers the
same part of a universe is then computed over the same examples, and a paired difference between
two of the table's configurations pairs exactly the examples their score cells average.
``harness.analysis.stats.compare`` keeps its own pairing: a difference whose sides are not the
table's cells pairs what its two sides share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from harness.analysis.stats import PAIR_KEY, select

#: Selection keys that name a configuration; every other key selects examples.
CONFIGURATION = frozenset({"variant", "method", "method_params", "rho"})
#: What an example can be compared with: its model and its task (a benchmark).
UNIVERSE = ("model", "task")


def is_configuration(key: str) -> bool:
    return key in CONFIGURATION or key.startswith("p.")


def example_keys(frame: pd.DataFrame) -> pd.Series:
    """One string per record naming its example (``PAIR_KEY``), aligned with ``frame``."""
    return _joined(frame, PAIR_KEY)


def universes(frame: pd.DataFrame) -> pd.Series:
    """One string per record naming its universe (``UNIVERSE``), aligned with ``frame``."""
    return _joined(frame, UNIVERSE)


def _joined(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    if frame.empty:
        return pd.Series(dtype=str, index=frame.index)
    parts = [frame[c].astype(object).where(frame[c].notna(), "").astype(str) for c in columns]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined + "\x1f" + part
    return joined


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple | set | frozenset) else value


def configuration(where: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The configuration part of a cell's selection (empty for a cell that compares, such as a difference)."""
    return tuple(sorted((k, _hashable(v)) for k, v in where.items() if is_configuration(k)))


def shared_examples(frame: pd.DataFrame, cells: Sequence[tuple[Mapping[str, Any], pd.DataFrame]]) -> pd.DataFrame:
    """``frame`` without the examples some configuration of the table lacks.

    ``cells`` are the table's cells as (selection, the records it selects). Each configuration's
    examples are those its cells select; an example stays where every configuration with records in
    its universe recorded it. Cells without a configuration constrain nothing.
    """
    if frame.empty:
        return frame
    recorded: dict[tuple, set[str]] = {}
    reached: dict[tuple, set[str]] = {}
    for where, records in cells:
        key = configuration(where)
        if not key or records.empty:
            continue
        recorded.setdefault(key, set()).update(example_keys(records))
        reached.setdefault(key, set()).update(universes(records))
    if not recorded:
        return frame
    examples, places = example_keys(frame), universes(frame)
    keep = pd.Series(True, index=frame.index)
    for key, found in recorded.items():
        keep &= ~places.isin(reached[key]) | examples.isin(found)
    return frame[keep]


def among(frame: pd.DataFrame, configurations: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``frame`` without the examples some of ``configurations`` lacks (a figure's curves, as a table's cells)."""
    return shared_examples(frame, [(where, _selected(frame, where)) for where in configurations])


def _selected(frame: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
    # A configuration naming a parameter no record carries ran nowhere.
    return frame.iloc[0:0] if any(key not in frame.columns for key in where) else select(frame, where)


def count_examples(records: pd.DataFrame) -> int:
    """How many examples ``records`` cover (a full cache run at two rho counts once)."""
    return int(example_keys(records).nunique()) if not records.empty else 0
