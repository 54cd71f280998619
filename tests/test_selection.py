"""Selection: the budget B = floor((1 - rho) * L0), its validation, and select() on hand-made rows."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch

from methods.aggregators.cumulative import Cumulative
from methods.aggregators.ema import EMA
from methods.aggregators.single_step import SingleStep
from methods.base import SequenceInfo
from methods.scored import ScoredEviction
from methods.scorers.attention import AttentionScorer
from methods.selection import Selection


def info(prefill_len: int) -> SequenceInfo:
    return SequenceInfo(prefill_len=prefill_len, num_layers=2, num_kv_heads=1, num_query_heads=1, max_new_tokens=4)


# --------------------------------------------------------------------------------------------- budget


def test_budget_rho_09_of_1000_is_100_not_99() -> None:
    # (1 - 0.9) * 1000 == 99.99999999999997 in floating point: the float trap.
    assert (1 - 0.9) * 1000 < 100
    assert Selection(rho=0.9).budget_for(1000) == 100


@pytest.mark.parametrize("rho", ["0.1", "0.25", "0.3", "0.5", "0.6", "0.7", "0.75", "0.8", "0.9", "0.95", "0.99"])
def test_budget_is_the_exact_floor_for_decimal_rho(rho: str) -> None:
    selection = Selection(rho=float(rho))
    for prefill_len in range(100, 3000, 7):
        assert selection.budget_for(prefill_len) == math.floor((1 - Fraction(rho)) * prefill_len), prefill_len


def test_budget_floors_rather_than_rounds() -> None:
    assert Selection(rho=0.5).budget_for(9) == 4
    assert Selection(rho=0.75).budget_for(10) == 2


def test_rho_zero_means_no_budget_and_no_observation() -> None:
    assert Selection(rho=0.0).budget_for(1000) is None
    method = ScoredEviction(AttentionScorer(), EMA(), Selection(rho=0.0))
    method.begin(info(50))
    assert method.budget() is None
    assert not any(method.observes(t) for t in range(0, 20))
    assert not any(method.needs_attention(t) for t in range(0, 20))
    positions = [torch.arange(51)[None]] * 2
    assert method.keep(0, positions) is None
    assert method.keep(1, positions) is None


def test_budget_tokens_overrides_rho() -> None:
    assert Selection(rho=0.9, budget_tokens=7).budget_for(1000) == 7
    assert Selection(rho=0.0, budget_tokens=7).budget_for(1000) == 7
    method = ScoredEviction(AttentionScorer(), EMA(), Selection(rho=0.0, budget_tokens=7))
    method.begin(info(50))
    assert method.budget() == 7
    assert method.observes(1)


def test_budget_below_sinks_plus_window_raises_naming_all_three() -> None:
    selection = Selection(rho=0.9, sinks=4, window=8)
    with pytest.raises(ValueError) as raised:
        selection.budget_for(100)  # B = 10 < 4 + 8
    message = str(raised.value)
    assert re.search(r"\bB=10\b", message), message
    assert "sinks" in message and "window" in message, message
    assert "4+8" in message, message
    # Exactly sinks + window is fine.
    assert selection.budget_for(120) == 12


def test_budget_of_zero_raises_even_without_protection() -> None:
    with pytest.raises(ValueError, match=r"\bB=0\b"):
        Selection(rho=0.99).budget_for(50)


def test_budget_below_sinks_plus_window_raises_from_begin() -> None:
    method = ScoredEviction(AttentionScorer(), EMA(), Selection(budget_tokens=3, sinks=4))
    with pytest.raises(ValueError, match=r"B=3\b.*sinks"):
        method.begin(info(50))


def test_recent_fraction_counts_towards_protection() -> None:
    # recent_fraction=0.5 of B=2 protects 1, plus 2 sinks = 3 > 2.
    with pytest.raises(ValueError, match=r"B=2\b"):
        Selection(budget_tokens=2, sinks=2, recent_fraction=0.5).budget_for(100)


@pytest.mark.parametrize("rho", [1.0, -0.1, 1.5])
def test_rho_outside_unit_interval_raises(rho: float) -> None:
    with pytest.raises(ValueError, match=re.escape(f"rho={rho}")):
        Selection(rho=rho)


def test_unknown_granularity_raises() -> None:
    with pytest.raises(ValueError, match="granularity='channel'"):
        Selection(granularity="channel")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"budget_tokens": 0}, "budget_tokens=0"),
        ({"sinks": -1}, "sinks=-1"),
        ({"window": -2}, "window=-2"),
        ({"recent_fraction": 1.0}, "recent_fraction=1.0"),
    ],
)
def test_other_bad_selection_values_raise(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        Selection(**kwargs)


@pytest.mark.parametrize("alpha", [1.0, -0.2, 2.0])
def test_ema_alpha_outside_unit_interval_raises(alpha: float) -> None:
    with pytest.raises(ValueError, match=re.escape(f"alpha={alpha}")):
        EMA(alpha=alpha)


@pytest.mark.parametrize("refresh_every", [0, -3])
def test_refresh_every_below_one_raises(refresh_every: int) -> None:
    with pytest.raises(ValueError, match=re.escape(f"refresh_every={refresh_every}")):
        ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), refresh_every=refresh_every)


def test_aggregation_rules_on_hand_values() -> None:
    state = torch.tensor([[1.0, 2.0, 0.0]])
    score = torch.tensor([[0.5, 0.0, 4.0]])
    torch.testing.assert_close(SingleStep().combine(state, score), score)
    torch.testing.assert_close(Cumulative().combine(state, score), torch.tensor([[1.5, 2.0, 4.0]]))
    torch.testing.assert_close(EMA(alpha=0.75).combine(state, score), torch.tensor([[0.875, 1.5, 1.0]]))


# ------------------------------------------------------------------------------------------ recent()


def test_recent_fraction_half_of_ten_protects_five() -> None:
    assert Selection(recent_fraction=0.5).recent(10) == 5
    assert Selection(recent_fraction=0.5, window=7).recent(10) == 7  # the larger wins
    assert Selection(recent_fraction=0.5, window=3).recent(10) == 5
    assert Selection(window=3).recent(10) == 3


@pytest.mark.parametrize("fraction", ["0.1", "0.2", "0.25", "0.29", "0.3", "0.5", "0.57", "0.7"])
def test_recent_fraction_floor_is_exact_for_decimal_fractions(fraction: str) -> None:
    # Same float trap as the budget: floor(0.29 * 100) must be 29 (0.29 * 100 == 28.999999999999996).
    selection = Selection(recent_fraction=float(fraction))
    for budget in range(1, 1001):
        assert selection.recent(budget) == math.floor(Fraction(fraction) * budget), budget


# ------------------------------------------------------------------------------------------ select()


def test_select_keeps_sinks_and_window_even_with_lowest_priority() -> None:
    selection = Selection(sinks=2, window=3)
    positions = torch.arange(12)[None]
    # Protected entries get the lowest priorities so only protection can keep them.
    priority = torch.tensor([[-9.0, -8.0, 0.1, 0.9, 0.2, 0.8, 0.3, 0.4, 0.05, -7.0, -6.0, -5.0]])
    kept = selection.select(priority, positions, seen=12, budget=7)
    assert kept.tolist() == [[0, 1, 3, 5, 9, 10, 11]]


@pytest.mark.parametrize(
    "options,slot",
    [
        ({}, 1),
        ({"sinks": 2}, 4),
        ({"window": 2}, 1),
        ({"sinks": 2, "window": 2}, 3),
        ({"sinks": 2, "recent_fraction": 0.5}, 3),
    ],
    ids=repr,
)
def test_evict_one_gives_up_the_lowest_unprotected_slot_and_masks_nothing_when_nothing_is_protected(
    options, slot
) -> None:
    selection = Selection(**options)
    positions = torch.tensor([[0, 1, 7, 3, 9, 5, 6]])  # slot order after refills: position 9 in slot 4
    priority = torch.tensor([[0.0, -1.0, 0.4, 0.1, -0.5, 0.3, 0.5]])
    # Sinks 2 protect slots 0 and 1; a window of 2 (or half of B = 6) at seen 10 protects position 9, slot 4.
    assert selection.evict_one(priority, positions, torch.tensor(10), budget=6, reserved=None).tolist() == [[slot]]
    assert selection.protects(6) == bool(options)


def test_select_returns_indices_not_positions_after_eviction() -> None:
    selection = Selection(sinks=1, window=2)
    positions = torch.tensor([[0, 1, 5, 7, 9, 12, 13, 14]])
    priority = torch.tensor([[0.0, 0.5, 0.1, 0.9, 0.7, 0.2, 0.0, 0.0]])
    kept = selection.select(priority, positions, seen=15, budget=5)
    # index 0 (sink), indices 6, 7 (positions 13, 14 >= 15 - 2), then the top-2 rest: idx 3, 4.
    assert kept.tolist() == [[0, 3, 4, 6, 7]]


def test_select_window_is_relative_to_seen_not_to_the_cache() -> None:
    # Position 9 is the newest cached, but seen=12 (10 and 11 evicted): window=2 protects >= 10 only.
    selection = Selection(window=2)
    positions = torch.tensor([[2, 4, 6, 8, 9]])
    priority = torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1]])
    assert selection.select(priority, positions, seen=12, budget=2).tolist() == [[0, 1]]


def test_select_recent_fraction_half_of_ten_protects_five_recent() -> None:
    selection = Selection(recent_fraction=0.5)
    positions = torch.arange(20)[None]
    priority = -torch.arange(20.0)[None]  # older is better: only protection keeps the recent ones
    kept = selection.select(priority, positions, seen=20, budget=10)
    assert kept.tolist() == [[0, 1, 2, 3, 4, 15, 16, 17, 18, 19]]


def test_select_per_row_sets_differ_with_equal_counts_and_sorted() -> None:
    selection = Selection(sinks=1)
    positions = torch.arange(8).expand(2, -1)
    priority = torch.tensor(
        [
            [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6],
            [0.0, 0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.4],
        ]
    )
    kept = selection.select(priority, positions, seen=8, budget=4)
    assert kept.shape == (2, 4)
    assert kept.tolist() == [[0, 1, 3, 5], [0, 2, 4, 6]]
    assert torch.equal(kept, kept.sort(dim=-1).values)


def test_select_keep_count_equals_budget_for_many_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    selection = Selection(sinks=3, window=4)
    priority = torch.rand(5, 40, generator=generator)
    positions = torch.arange(40).expand(5, -1)
    kept = selection.select(priority, positions, seen=40, budget=17)
    assert kept.shape == (5, 17)
    for row in range(5):
        chosen = set(kept[row].tolist())
        assert len(chosen) == 17
        assert {0, 1, 2, 36, 37, 38, 39} <= chosen
        rest = [i for i in range(3, 36)]
        top = sorted(rest, key=lambda i: -priority[row, i].item())[:10]
        assert chosen == {0, 1, 2, 36, 37, 38, 39, *top}
