"""Budgets shared across heads (AdaKV's adaptive split, KVzip's pool), on hand-made scores."""

from __future__ import annotations

import torch

from methods.allocation import adaptive_keep, pooled_keep


def lists(keep: tuple[torch.Tensor, ...]) -> list[list[int]]:
    return [row.tolist() for row in keep]


def test_pooled_keep_takes_the_best_over_all_rows():
    rows = [torch.tensor([5.0, 1.0, 3.0]), torch.tensor([4.0, 6.0]), torch.tensor([0.5])]
    # The three best of 5, 1, 3 | 4, 6 | 0.5 are 6, 5, 4: two rows get entries, one gets none.
    assert lists(pooled_keep(rows, 3)) == [[0], [0, 1], []]
    assert lists(pooled_keep(rows, 6)) == [[0, 1, 2], [0, 1], [0]]


def test_pooled_keep_handles_empty_rows_and_returns_sorted_indices():
    rows = [torch.tensor([1.0, 9.0, 2.0, 8.0]), torch.tensor([]), torch.tensor([0.5, 7.0])]
    assert lists(pooled_keep(rows, 3)) == [[1, 3], [], [1]]


def test_adaptive_keep_moves_slots_to_the_head_with_spread_scores():
    # Head 0 is concentrated (one strong entry), head 1 spread: of the 2 x 2 slots head 1 takes 3.
    concentrated = torch.tensor([0.9, 0.04, 0.03, 0.03])
    spread = torch.tensor([0.3, 0.25, 0.25, 0.2])
    none = [torch.zeros(4, dtype=torch.bool)] * 2
    assert lists(adaptive_keep([concentrated, spread], none, budget=2, safeguard=0.0)) == [[0], [0, 1, 2]]


def test_adaptive_keep_safeguard_floor_and_protected_entries():
    concentrated = torch.tensor([0.9, 0.04, 0.03, 0.02])
    spread = torch.tensor([0.3, 0.26, 0.24, 0.2])
    # safeguard 0.5 of B = 2: each head keeps its own best entry whatever the other head scores.
    floor = adaptive_keep([spread, concentrated], [torch.zeros(4, dtype=torch.bool)] * 2, budget=2, safeguard=0.5)
    assert lists(floor) == [[0, 1, 2], [0]]
    # Protected entries (here head 0's last) are kept before any score counts.
    protected = [torch.tensor([False, False, False, True]), torch.zeros(4, dtype=torch.bool)]
    kept = adaptive_keep([spread, concentrated], protected, budget=2, safeguard=0.5)
    assert lists(kept) == [[0, 1, 3], [0]]
    assert sum(len(row) for row in kept) == 2 * 2
