"""``harness.stats``: paired bootstrap and t-test against scipy and hand-computed cases."""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from harness.analysis.stats import AVERAGE, compare, paired_bootstrap, paired_ttest

A = [0.61, 0.72, 0.55, 0.90, 0.48, 0.66, 0.71, 0.83, 0.59, 0.62]
B = [0.64, 0.70, 0.61, 0.93, 0.55, 0.65, 0.78, 0.85, 0.60, 0.70]


def test_ttest_matches_scipy() -> None:
    expected = scipy_stats.ttest_rel(B, A)
    result = paired_ttest(A, B)
    assert result.statistic == pytest.approx(expected.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    assert result.df == len(A) - 1
    assert result.statistic > 0  # b - a: the candidate scores higher here


def test_ttest_degenerate_differences() -> None:
    same = paired_ttest([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.statistic, same.p_value) == (0.0, 1.0)
    shifted = paired_ttest([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert shifted.statistic == -math.inf and shifted.p_value == 0.0
    assert math.isnan(paired_ttest([1.0], [2.0]).p_value)


def test_bootstrap_constant_difference_is_exact() -> None:
    a = np.linspace(0.0, 1.0, 37)
    # (a + 0.25) - a differs from 0.25 in the last bit for some entries: still one value.
    assert len(np.unique((a + 0.25) - a)) > 1
    result = paired_bootstrap(a, a + 0.25, n_resamples=500)
    assert (result.mean_diff, result.ci_low, result.ci_high) == (0.25, 0.25, 0.25)
    assert result.p_value == 0.0 and result.n == 37
    assert result.mean_a == pytest.approx(0.5) and result.mean_b == pytest.approx(0.75)
    zero = paired_bootstrap(a, a)
    assert (zero.mean_diff, zero.ci_low, zero.ci_high, zero.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_bootstrap_hand_computed_two_points() -> None:
    # Differences (0, 1): a resample's mean is k/2 with k ~ Binomial(2, 1/2), so the means are
    # 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4; the 95% percentile interval is [0, 1] and the
    # 40%-60% one is [0.5, 0.5].
    a, b = [0.0, 0.0], [0.0, 1.0]
    wide = paired_bootstrap(a, b, n_resamples=4000, seed=1)
    assert (wide.ci_low, wide.ci_high, wide.mean_diff) == (0.0, 1.0, 0.5)
    narrow = paired_bootstrap(a, b, n_resamples=4000, seed=1, confidence=0.2)
    assert (narrow.ci_low, narrow.ci_high) == (0.5, 0.5)


def test_bootstrap_seeded_synthetic_covers_truth_and_is_reproducible() -> None:
    rng = np.random.default_rng(123)
    a = rng.normal(0.5, 0.2, size=400)
    b = a + 0.05 + rng.normal(0.0, 0.1, size=400)  # true mean difference 0.05

    first = paired_bootstrap(a, b, seed=7)
    again = paired_bootstrap(a, b, seed=7)
    other = paired_bootstrap(a, b, seed=8)

    assert first.ci_low < 0.05 < first.ci_high
    assert first.ci_low < first.mean_diff < first.ci_high
    assert first == again
    assert (other.ci_low, other.ci_high) != (first.ci_low, first.ci_high)
    assert other.mean_diff == first.mean_diff  # only the interval depends on the seed
    # The interval is about mean_diff ± 1.96 standard errors of the mean difference.
    half_width = 1.96 * np.std(b - a, ddof=1) / np.sqrt(400)
    assert (first.ci_high - first.ci_low) / 2 == pytest.approx(half_width, rel=0.1)


def test_bootstrap_agrees_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(5)
    a = rng.uniform(0, 1, size=150)
    b = np.clip(a + rng.normal(0.03, 0.15, size=150), 0, 1)

    ours = paired_bootstrap(a, b, n_resamples=20_000, seed=0)
    theirs = scipy_stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(y - x, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=20_000,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(1),
    )
    # Different random streams: the endpoints agree up to Monte Carlo noise, a small
    # fraction of the interval's width.
    width = ours.ci_high - ours.ci_low
    assert ours.ci_low == pytest.approx(theirs.confidence_interval.low, abs=0.05 * width)
    assert ours.ci_high == pytest.approx(theirs.confidence_interval.high, abs=0.05 * width)


def test_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="length"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap([1.0, float("nan")], [1.0, 2.0])


def frame(rows: list[tuple[str, float, str, str, float]]) -> pd.DataFrame:
    """Rows of (method, rho, subtask, example_id, score) for one model, task and seed."""
    return pd.DataFrame(
        [
            {
                "model": "tiny",
                "method": method,
                "method_params": f"{method}-hash",
                "task": "ruler",
                "subtask": subtask,
                "rho": rho,
                "seed": 0,
                "example_id": example_id,
                "score": score,
            }
            for method, rho, subtask, example_id, score in rows
        ]
    )


def test_compare_known_values_and_unpaired_ids(caplog: pytest.LogCaptureFixture) -> None:
    rows = [
        # s1: candidate gains 0.5 on one of two examples -> mean_diff 0.25
        ("full", 0.9, "s1", "s1/0", 1.0),
        ("full", 0.9, "s1", "s1/1", 0.5),
        ("inertia", 0.9, "s1", "s1/0", 1.0),
        ("inertia", 0.9, "s1", "s1/1", 1.0),
        # s2: constant loss 0.5 -> exact interval; s2/2 has no candidate, s2/9 no baseline
        ("full", 0.9, "s2", "s2/0", 1.0),
        ("full", 0.9, "s2", "s2/1", 1.0),
        ("full", 0.9, "s2", "s2/2", 0.0),
        ("inertia", 0.9, "s2", "s2/0", 0.5),
        ("inertia", 0.9, "s2", "s2/1", 0.5),
        ("inertia", 0.9, "s2", "s2/9", 0.0),
        # another rho of the candidate: not selected
        ("inertia", 0.5, "s1", "s1/0", 0.0),
    ]
    with caplog.at_level(logging.WARNING):
        table = compare(frame(rows), {"method": "full"}, {"method": "inertia", "rho": 0.9}, n_resamples=2000)

    assert "1 baseline and 1 candidate examples have no partner" in caplog.text
    table = table.set_index(["task", "subtask"])
    s1, s2, avg = table.loc[("ruler", "s1")], table.loc[("ruler", "s2")], table.loc[("ruler", AVERAGE)]
    assert (s1.n, s1.mean_baseline, s1.mean_candidate, s1.mean_diff) == (2, 0.75, 1.0, 0.25)
    assert s1.ci_low == 0.0 and s1.ci_high == 0.5
    assert (s1.unpaired_baseline, s1.unpaired_candidate) == (0, 0)
    assert (s2.n, s2.mean_diff, s2.ci_low, s2.ci_high, s2.p_value) == (2, -0.5, -0.5, -0.5, 0.0)
    assert (s2.unpaired_baseline, s2.unpaired_candidate) == (1, 1)
    # The average pools the four shared examples: differences (0, 0.5, -0.5, -0.5).
    assert avg.n == 4
    assert avg.mean_diff == pytest.approx(-0.125)
    assert avg.p_value == pytest.approx(scipy_stats.ttest_rel([1.0, 1.0, 0.5, 0.5], [1.0, 0.5, 1.0, 1.0]).pvalue)
    assert (avg.unpaired_baseline, avg.unpaired_candidate) == (1, 1)
    assert list(table.index.get_level_values("subtask")) == ["s1", "s2", AVERAGE]


def test_compare_refuses_ambiguous_selection() -> None:
    rows = [
        ("full", 0.5, "s1", "s1/0", 1.0),
        ("full", 0.9, "s1", "s1/0", 1.0),
        ("inertia", 0.9, "s1", "s1/0", 1.0),
    ]
    with pytest.raises(ValueError, match="rho"):
        compare(frame(rows), {"method": "full"}, {"method": "inertia"})
    # Narrowed, it pairs.
    table = compare(frame(rows), {"method": "full", "rho": 0.9}, {"method": "inertia"}, by=())
    assert table.n.tolist() == [1]


def test_compare_group_without_shared_examples() -> None:
    rows = [("full", 0.9, "s1", "s1/0", 1.0), ("inertia", 0.9, "s1", "s1/1", 1.0)]
    table = compare(frame(rows), {"method": "full"}, {"method": "inertia"}, by=("subtask",))
    assert table.subtask.tolist() == ["s1", AVERAGE]
    assert table.n.tolist() == [0, 0]
    assert table.mean_diff.isna().all()
    assert table.unpaired_baseline.tolist() == [1, 1]
