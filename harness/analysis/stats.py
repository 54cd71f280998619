"""Paired statistics over shared example ids: bootstrap CI of the mean difference, paired t-test.

Two configurations evaluated on the same examples are compared example by example: the
per-example difference removes the (large) variance between examples, which an unpaired
comparison of two means would leave in. Every difference here is ``b - a``, "candidate minus
baseline": a positive ``mean_diff`` means the candidate (e.g. an eviction method) scores
higher than the baseline (e.g. the full cache).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats as scipy_stats

log = logging.getLogger(__name__)

# Columns that make two records "the same example": the configurations being compared differ
# in the other identity columns (method, method_params, rho), never in these.
PAIR_KEY: tuple[str, ...] = ("model", "task", "subtask", "seed", "example_id")

# Bootstrap indices are drawn in blocks of at most this many, so 10,000 resamples of a
# benchmark with thousands of examples need tens of MB rather than gigabytes.
_BLOCK_ELEMENTS = 1 << 22

AVERAGE = "average"

# Differences this close (relative to their size) are one value written with rounding error.
_ROUNDING = 1e-12


@dataclass(frozen=True)
class PairedTTest:
    """Paired t-test of ``b - a``: the t statistic, its two-sided p-value and degrees of freedom."""

    statistic: float
    p_value: float
    df: int


@dataclass(frozen=True)
class PairedComparison:
    """Paired comparison of a baseline ``a`` and a candidate ``b`` on the same ``n`` examples.

    ``mean_diff = mean(b - a)``; ``[ci_low, ci_high]`` is the percentile bootstrap interval of
    that mean at ``confidence``; ``p_value`` is the two-sided paired t-test's.
    """

    mean_a: float
    mean_b: float
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    confidence: float
    n_resamples: int


def _paired_arrays(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a_arr = np.asarray(a, dtype=float).ravel()
    b_arr = np.asarray(b, dtype=float).ravel()
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired samples differ in length: {a_arr.size} and {b_arr.size}")
    if a_arr.size == 0:
        raise ValueError("paired samples are empty")
    # A NaN would silently turn every statistic into NaN; the caller decides what it means.
    if not (np.isfinite(a_arr).all() and np.isfinite(b_arr).all()):
        raise ValueError("paired samples hold NaN or infinite values")
    return a_arr, b_arr


def _constant(diff: np.ndarray) -> float | None:
    """The common value of ``diff`` if all its entries agree up to rounding, else None.

    Scores differenced in floating point (``0.85 - 0.6`` against ``0.5 - 0.25``) disagree in
    the last bits; treated as distinct they give scipy a spurious "catastrophic cancellation"
    and an interval of pure rounding noise.
    """
    scale = max(1.0, float(np.abs(diff).max()))
    if float(np.ptp(diff)) > _ROUNDING * scale:
        return None
    value = float(diff.mean())
    return 0.0 if abs(value) <= _ROUNDING * scale else value


def paired_ttest(a: ArrayLike, b: ArrayLike) -> PairedTTest:
    """Two-sided paired t-test of ``b - a`` (``scipy.stats.ttest_rel(b, a)``).

    scipy answers NaN when every difference is the same (up to rounding); here identical
    samples (all differences 0) give ``statistic=0, p_value=1`` (no evidence of a
    difference), and a constant non-zero difference gives ``statistic=±inf, p_value=0`` (the
    limit of the test as the spread vanishes). With one pair there is no variance to test
    against: NaN.
    """
    a_arr, b_arr = _paired_arrays(a, b)
    diff = b_arr - a_arr
    n = diff.size
    if n < 2:
        return PairedTTest(statistic=math.nan, p_value=math.nan, df=0)
    constant = _constant(diff)
    if constant is not None:
        if constant == 0.0:
            return PairedTTest(statistic=0.0, p_value=1.0, df=n - 1)
        return PairedTTest(statistic=math.copysign(math.inf, constant), p_value=0.0, df=n - 1)
    result = scipy_stats.ttest_rel(b_arr, a_arr)
    return PairedTTest(statistic=float(result.statistic), p_value=float(result.pvalue), df=int(result.df))


def bootstrap_means(diff: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """Means of ``n_resamples`` resamples (with replacement) of ``diff``, drawn from ``default_rng(seed)``.

    Indices are drawn in blocks whose size depends only on ``len(diff)``, so the result is a
    function of (``diff``, ``n_resamples``, ``seed``) alone.
    """
    n = diff.size
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    block = max(1, _BLOCK_ELEMENTS // n)
    for start in range(0, n_resamples, block):
        stop = min(start + block, n_resamples)
        indices = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diff[indices].mean(axis=1)
    return means


def paired_bootstrap(
    a: ArrayLike,
    b: ArrayLike,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> PairedComparison:
    """Paired bootstrap of ``mean(b - a)`` with a percentile confidence interval.

    Example indices are resampled jointly, so each resample keeps every example's ``a`` and
    ``b`` together. The interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles (numpy's linear interpolation, as ``scipy.stats.bootstrap(method="percentile")``)
    of the resampled means. The p-value is the paired t-test's (``paired_ttest``).
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, not {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), not {confidence}")
    a_arr, b_arr = _paired_arrays(a, b)
    diff = b_arr - a_arr
    constant = _constant(diff)
    if constant is not None:
        # Every resample has the same mean; saying so exactly avoids an interval of rounding
        # noise around it.
        mean_diff = ci_low = ci_high = constant
    else:
        mean_diff = float(diff.mean())
        tail = (1.0 - confidence) / 2.0
        ci_low, ci_high = (float(q) for q in np.quantile(bootstrap_means(diff, n_resamples, seed), [tail, 1 - tail]))
    return PairedComparison(
        mean_a=float(a_arr.mean()),
        mean_b=float(b_arr.mean()),
        mean_diff=mean_diff,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=paired_ttest(a_arr, b_arr).p_value,
        n=int(diff.size),
        confidence=confidence,
        n_resamples=n_resamples,
    )


def select(df: pd.DataFrame, spec: Mapping[str, Any]) -> pd.DataFrame:
    """Rows of ``df`` matching ``spec``: ``{column: value}``, a list/tuple/set value meaning "any of"."""
    mask = pd.Series(True, index=df.index)
    for column, value in spec.items():
        if column not in df.columns:
            raise KeyError(f"no column {column!r} to select on (columns: {sorted(df.columns)})")
        if isinstance(value, list | tuple | set | frozenset):
            mask &= df[column].isin(list(value))
        else:
            mask &= df[column] == value
    return df[mask]


def _single_per_example(rows: pd.DataFrame, spec: Mapping[str, Any], role: str) -> None:
    # A selection such as {"method": "full"} matches one record per example only if full was
    # run at a single rho (and parameter set); pairing against an arbitrary one would be a
    # silent choice, so name what varies and let the caller narrow the selection.
    duplicated = rows[rows.duplicated(list(PAIR_KEY), keep=False)]
    if duplicated.empty:
        return
    varying = {
        column: sorted(duplicated[column].dropna().unique().tolist(), key=str)
        for column in ("method", "method_params", "rho", "task_params", "run_id")
        if column in duplicated.columns and duplicated[column].nunique(dropna=True) > 1
    }
    raise ValueError(
        f"{role} selection {dict(spec)!r} matches several records per example"
        f" ({len(duplicated)} rows); they differ in {varying}: add one of these columns to the selection"
    )


def _row(comparison: PairedComparison | None) -> dict[str, Any]:
    if comparison is None:
        return {
            "n": 0,
            "mean_baseline": math.nan,
            "mean_candidate": math.nan,
            "mean_diff": math.nan,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "p_value": math.nan,
        }
    fields = asdict(comparison)
    return {
        "n": fields["n"],
        "mean_baseline": fields["mean_a"],
        "mean_candidate": fields["mean_b"],
        "mean_diff": fields["mean_diff"],
        "ci_low": fields["ci_low"],
        "ci_high": fields["ci_high"],
        "p_value": fields["p_value"],
    }


def _paired_sides(
    df: pd.DataFrame, baseline: Mapping[str, Any], candidate: Mapping[str, Any], metric: str, extra: list[str]
) -> pd.DataFrame:
    """Both sides' ``metric`` per example (``<metric>_a``, ``<metric>_b``), with ``_paired`` / ``_only_a`` /
    ``_only_b`` flags; ``extra`` group columns outside ``PAIR_KEY`` take the side that has them."""
    if metric not in df.columns:
        raise KeyError(f"no column {metric!r} (metric columns: {[c for c in df.columns if c.startswith('metric.')]})")
    columns = list(dict.fromkeys([*PAIR_KEY, *extra, metric]))
    sides = []
    for spec, role in ((baseline, "baseline"), (candidate, "candidate")):
        rows = select(df, spec)
        _single_per_example(rows, spec, role)
        sides.append(rows[columns])
    merged = sides[0].merge(sides[1], on=list(PAIR_KEY), how="outer", suffixes=("_a", "_b"))
    for column in extra:
        # A one-sided example has its group column only on its own side.
        merged[column] = merged[f"{column}_a"].combine_first(merged[f"{column}_b"])
    # After the outer merge a side's metric is NaN both where the side has no record and where
    # the record holds no value (e.g. decode_tokens_per_s of a one-token answer): neither pairs.
    has_a, has_b = merged[f"{metric}_a"].notna(), merged[f"{metric}_b"].notna()
    merged["_paired"] = has_a & has_b
    merged["_only_a"] = has_a & ~has_b
    merged["_only_b"] = has_b & ~has_a
    only_a, only_b = int(merged["_only_a"].sum()), int(merged["_only_b"].sum())
    if only_a or only_b:
        log.warning(
            "compare %s vs %s on %s: %d baseline and %d candidate examples have no partner and are left out",
            dict(baseline),
            dict(candidate),
            metric,
            only_a,
            only_b,
        )
    return merged


def compare(
    df: pd.DataFrame,
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    metric: str = "score",
    by: Sequence[str] = ("task", "subtask"),
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Paired comparison of two configurations per group of ``by``, plus an average row.

    ``baseline`` and ``candidate`` select rows of a ``harness.analysis.results.load_results`` table
    (see ``select``), e.g. ``{"method": "full"}`` and ``{"method": "inertia", "rho": 0.9}``;
    each must match at most one record per example. Records pair on ``PAIR_KEY`` (model,
    task, subtask, seed, example id): only examples both configurations recorded, with a
    finite ``metric`` on both sides, enter the statistics. The others are counted in
    ``unpaired_baseline`` / ``unpaired_candidate`` and reported with a logged warning.
    ``by`` columns outside ``PAIR_KEY`` (e.g. ``meta.length``) take the baseline's value.

    Besides one row per ``by`` group, every group of ``by[:-1]`` (every task, by default)
    gets a row whose ``by[-1]`` is ``"average"``: the paired bootstrap and t-test over all
    its shared examples pooled. That is the mean over subtasks of the subtask means (the
    papers' benchmark average) exactly when the subtasks contribute equally many examples,
    as in RULER; otherwise larger subtasks weigh more, and a message says so. With an empty
    ``by`` there is a single row over everything.

    Columns: ``by``, ``n``, ``mean_baseline``, ``mean_candidate``, ``mean_diff`` (candidate
    minus baseline), ``ci_low``, ``ci_high``, ``p_value``, ``unpaired_baseline``,
    ``unpaired_candidate``.
    """
    by = list(by)
    merged = _paired_sides(df, baseline, candidate, metric, [column for column in by if column not in PAIR_KEY])
    a_col, b_col = f"{metric}_a", f"{metric}_b"
    paired = merged[merged["_paired"]]
    if "model" not in by and paired["model"].nunique() > 1:
        # Differences from different models are pooled into one interval: rarely intended.
        log.warning("compare: pooling %d models (add 'model' to by to separate them)", paired["model"].nunique())

    def summarize(group: pd.DataFrame) -> dict[str, Any]:
        shared = group[group["_paired"]]
        comparison = (
            paired_bootstrap(shared[a_col], shared[b_col], n_resamples=n_resamples, seed=seed, confidence=confidence)
            if len(shared)
            else None
        )
        return {
            **_row(comparison),
            "unpaired_baseline": int(group["_only_a"].sum()),
            "unpaired_candidate": int(group["_only_b"].sum()),
        }

    relevant = merged[merged["_paired"] | merged["_only_a"] | merged["_only_b"]]
    out: list[dict[str, Any]] = []
    if not by:
        out.append(summarize(relevant))
        return pd.DataFrame(out)
    outer = by[:-1]
    outer_groups = relevant.groupby(outer, dropna=False, sort=True) if outer else [((), relevant)]
    for outer_key, outer_rows in outer_groups:
        outer_key = outer_key if isinstance(outer_key, tuple) else (outer_key,)
        for inner_key, rows in outer_rows.groupby(by[-1], dropna=False, sort=True):
            out.append({**dict(zip(by, (*outer_key, inner_key), strict=True)), **summarize(rows)})
        sizes = outer_rows[outer_rows["_paired"]].groupby(by[-1], dropna=False).size()
        if sizes.nunique() > 1:
            log.info(
                "compare %s: the %s average pools examples, and %s groups differ in size (%d to %d):"
                " it is not the plain mean of the group means",
                dict(zip(outer, outer_key, strict=True)),
                by[-1],
                by[-1],
                sizes.min(),
                sizes.max(),
            )
        out.append({**dict(zip(by, (*outer_key, AVERAGE), strict=True)), **summarize(outer_rows)})
    return pd.DataFrame(out, columns=[*by, *_row(None).keys(), "unpaired_baseline", "unpaired_candidate"])


@dataclass(frozen=True)
class StratifiedComparison:
    """Paired difference averaged over strata (subtasks) with equal weight, as a benchmark mean is.

    ``mean_diff`` is the mean over strata of each stratum's mean ``b - a``; ``[ci_low, ci_high]``
    the percentile interval of that statistic when every stratum is resampled on its own;
    ``p_value`` the two-sided test of ``mean_diff = 0`` with the stratified standard error and
    Welch-Satterthwaite degrees of freedom (the paired t-test when there is one stratum).
    """

    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    strata: int


def stratified_paired_bootstrap(
    a: ArrayLike,
    b: ArrayLike,
    strata: ArrayLike,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> StratifiedComparison:
    """``b - a`` averaged over ``strata`` with equal weight; CI by resampling within each stratum.

    A benchmark score is the mean over subtasks of the subtask means, so its paired difference
    is the mean over subtasks of the per-subtask mean differences; pooling the examples instead
    weighs large subtasks more. Stratum ``i`` is resampled with seed ``seed + i`` (strata in
    sorted order), so the result depends on the data, ``n_resamples`` and ``seed`` only.
    """
    a_arr, b_arr = _paired_arrays(a, b)
    labels = np.asarray(strata, dtype=object).ravel()
    if labels.shape != a_arr.shape:
        raise ValueError(f"strata ({labels.size}) and samples ({a_arr.size}) differ in length")
    diff = b_arr - a_arr
    groups = [diff[labels == label] for label in sorted(set(labels.tolist()), key=str)]
    if len(groups) == 1:
        single = paired_bootstrap(a_arr, b_arr, n_resamples=n_resamples, seed=seed, confidence=confidence)
        return StratifiedComparison(single.mean_diff, single.ci_low, single.ci_high, single.p_value, single.n, 1)
    count = len(groups)
    mean_diff = float(np.mean([g.mean() for g in groups]))
    draws = np.zeros(n_resamples)
    for index, group in enumerate(groups):
        draws += group.mean() if _constant(group) is not None else bootstrap_means(group, n_resamples, seed + index)
    draws /= count
    tail = (1.0 - confidence) / 2.0
    if _constant(draws - draws.mean()) is not None:
        ci_low = ci_high = mean_diff
    else:
        ci_low, ci_high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
    # Var of the mean of stratum means: sum_i var_i / n_i / S^2; a one-example stratum adds none.
    parts = [g.var(ddof=1) / g.size / count**2 if g.size > 1 else 0.0 for g in groups]
    se = math.sqrt(sum(parts))
    if se == 0:
        p_value = 1.0 if abs(mean_diff) <= _ROUNDING else 0.0
    else:
        dof_terms = [p**2 / (g.size - 1) for p, g in zip(parts, groups, strict=True) if g.size > 1 and p > 0]
        dof = sum(parts) ** 2 / sum(dof_terms) if dof_terms else math.inf
        p_value = float(2 * scipy_stats.t.sf(abs(mean_diff) / se, dof))
    return StratifiedComparison(mean_diff, ci_low, ci_high, p_value, int(diff.size), count)
