"""SnapKV on hand-built queries and keys: the observation window votes, per KV head, once after prefill.

Keys are the unit vectors e_j (position j), so a query ``c * e_p`` has logit c on position p and 0
elsewhere: the window's attention targets are known by construction.
"""

from __future__ import annotations

import pytest
import torch
from conftest import refused
from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.driver import Driver
from methods.selection import Selection
from methods.snapkv import SnapKV

L0 = 16


def seq(kv_heads: int, group: int, layers: int = 1) -> SequenceInfo:
    return SequenceInfo(
        prefill_len=L0,
        num_layers=layers,
        num_kv_heads=kv_heads,
        num_query_heads=kv_heads * group,
        max_new_tokens=8,
    )


def snapkv(
    budget: int, window: int = 4, kernel_size: int = 1, pooling: str = "max", pool_over_window: bool = False
) -> SnapKV:
    selection = Selection(budget_tokens=budget, window=window, granularity="head")
    return SnapKV(selection=selection, kernel_size=kernel_size, pooling=pooling, pool_over_window=pool_over_window)


def unit_keys(kv_heads: int) -> Tensor:
    return torch.eye(L0).expand(kv_heads, -1, -1).clone()


def targeted_queries(targets: list[list[int]], scale: float = 1.0) -> Tensor:
    """``(query_heads, window, L0)``: window query i of query head h is ``scale * e_{targets[h][i]}``."""
    queries = torch.zeros(len(targets), len(targets[0]), L0)
    for head, row in enumerate(targets):
        for i, target in enumerate(row):
            queries[head, i, target] = scale
    return queries


def prefill(method: SnapKV | Driver, layer: int, queries: Tensor, kv_heads: int, scaling: float = 1.0) -> None:
    keys = unit_keys(kv_heads)
    view = LayerView(
        layer=layer,
        keys=keys,
        values=torch.ones_like(keys),
        positions=torch.arange(L0).expand(kv_heads, -1),
        queries=queries,
        scaling=scaling,
    )
    method.observe_prefill(view)


def prompt_positions(kv_heads: int, layers: int) -> list[Tensor]:
    return [torch.arange(L0).expand(kv_heads, -1)] * layers


def test_keeps_the_attended_positions_and_the_window_per_head_and_layer() -> None:
    method = snapkv(budget=8)
    method.begin(seq(kv_heads=2, group=2, layers=2))
    assert method.wants_prefill_queries == 4
    # Query heads 0, 1 share KV head 0; query heads 2, 3 share KV head 1 (HF repeat_kv order).
    layer0 = [[1, 3, 5, 7], [1, 3, 5, 7], [0, 2, 8, 10], [0, 2, 8, 10]]
    layer1 = [[9, 10, 11, 0], [9, 10, 11, 0], [4, 4, 6, 6], [5, 5, 11, 11]]
    prefill(method, 0, targeted_queries(layer0), kv_heads=2, scaling=10.0)
    prefill(method, 1, targeted_queries(layer1), kv_heads=2, scaling=10.0)
    plan = method.keep(0, prompt_positions(2, 2))
    assert plan is not None and [p.shape for p in plan] == [(2, 8), (2, 8)]
    window = [12, 13, 14, 15]
    assert plan[0].tolist() == [[1, 3, 5, 7, *window], [0, 2, 8, 10, *window]]
    assert plan[1].tolist() == [[0, 9, 10, 11, *window], [4, 5, 6, 11, *window]]


def test_the_window_is_kept_even_when_nothing_attends_to_it() -> None:
    method = snapkv(budget=6, window=4)
    method.begin(seq(kv_heads=1, group=1))
    # Every window query points at an old position; the window keys get almost no votes.
    prefill(method, 0, targeted_queries([[0, 1, 2, 3]], scale=20.0), kv_heads=1)
    plan = method.keep(0, prompt_positions(1, 1))
    kept = plan[0].tolist()[0]
    assert kept[-4:] == [12, 13, 14, 15]
    assert len(kept) == 6 and set(kept[:2]) <= {0, 1, 2, 3}


def test_group_attention_is_averaged_over_the_kv_heads_query_group() -> None:
    # KV head 0: query head 0 targets 2 strongly on all four window queries, query head 1 targets 6
    # on two of them: mean votes 2 > 6 > rest. Budget 6 leaves two prefix slots: {2, 6}.
    method = snapkv(budget=6)
    method.begin(seq(kv_heads=1, group=2))
    queries = targeted_queries([[2, 2, 2, 2], [6, 6, 0, 0]], scale=10.0)
    queries[1, 2:] = 0.0  # the last two window queries of head 1 attend uniformly
    prefill(method, 0, queries, kv_heads=1)
    assert method.keep(0, prompt_positions(1, 1))[0].tolist() == [[2, 6, 12, 13, 14, 15]]


def test_window_queries_never_attend_to_later_window_keys() -> None:
    # Window query 0 sits at position 12. It points at key 13 (logit 10) and, more weakly, at
    # position 4 (logit 5). Causally it cannot see 13, so nearly all its mass lands on 4.
    # Without the mask key 13 would absorb it, and position 9 (weak target of query 2) would win.
    method = snapkv(budget=6)
    method.begin(seq(kv_heads=1, group=1))
    queries = torch.zeros(1, 4, L0)
    queries[0, 0, 13], queries[0, 0, 4] = 10.0, 5.0
    queries[0, 1, 1] = 10.0
    queries[0, 2, 1], queries[0, 2, 9] = 10.0, 8.0
    queries[0, 3, 1] = 10.0
    prefill(method, 0, queries, kv_heads=1)
    assert method.keep(0, prompt_positions(1, 1))[0].tolist() == [[1, 4, 12, 13, 14, 15]]


@pytest.mark.parametrize(("scaling", "winner"), [(1.0, 3), (3.0, 8)])
def test_scores_use_the_view_scaling(scaling: float, winner: int) -> None:
    # Query 0 puts logit 4 on position 3; queries 1-3 put logit 1 on position 8. At temperature 1
    # position 3 collects ~0.82 against ~0.52 for position 8; with scaling 3 the three queries
    # concentrate on 8 (~1.8) while 3 stays ~1. One prefix slot: the winner depends on scaling.
    method = snapkv(budget=5)
    method.begin(seq(kv_heads=1, group=1))
    queries = torch.zeros(1, 4, L0)
    queries[0, 0, 3] = 4.0
    queries[0, 1:, 8] = 1.0
    prefill(method, 0, queries, kv_heads=1, scaling=scaling)
    assert method.keep(0, prompt_positions(1, 1))[0].tolist() == [[winner, 12, 13, 14, 15]]


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_pooling_spreads_a_peak_to_its_neighbours(pooling: str) -> None:
    method = snapkv(budget=7, kernel_size=3, pooling=pooling)
    method.begin(seq(kv_heads=1, group=1))
    prefill(method, 0, targeted_queries([[5, 5, 5, 5]], scale=12.0), kv_heads=1)
    assert method.keep(0, prompt_positions(1, 1))[0].tolist() == [[4, 5, 6, 12, 13, 14, 15]]


@pytest.mark.parametrize("pool_over_window", [False, True])
def test_pooling_stops_at_the_window_unless_asked(pool_over_window: bool) -> None:
    # Three window queries look at the window's first entry (12), one at entry 3.
    method = snapkv(budget=7, kernel_size=3, pool_over_window=pool_over_window)
    method.begin(seq(kv_heads=1, group=1))
    prefill(method, 0, targeted_queries([[12, 12, 12, 3]], scale=12.0), kv_heads=1)
    kept = method.keep(0, prompt_positions(1, 1))[0].tolist()[0]
    if pool_over_window:
        # Entry 11 borrows the window's peak at 12 and displaces one of 3's pooled neighbourhood.
        assert 11 in kept and len({2, 3, 4} & set(kept)) == 2 and kept[-4:] == [12, 13, 14, 15]
    else:
        assert kept == [2, 3, 4, 12, 13, 14, 15]


def test_selection_happens_once_after_prefill_then_the_cache_grows() -> None:
    method = snapkv(budget=8)
    driver = Driver(method, seq(kv_heads=2, group=1))
    assert not any(method.observes(t) for t in range(0, 10))
    assert not any(method.needs_attention(t) for t in range(0, 10))
    prefill(driver, 0, targeted_queries([[1, 3, 5, 7], [0, 2, 8, 10]], scale=10.0), kv_heads=2)
    plan = driver.end_prefill()
    assert plan is not None
    for _ in range(1, 6):
        driver.next_step()  # nothing to observe: SnapKV observes no decode step
        assert driver.end_step() is None
    assert driver.positions[0].shape == (2, 13)


def test_no_selection_within_budget_or_without_budget() -> None:
    within = snapkv(budget=L0)
    within.begin(seq(kv_heads=1, group=1))
    prefill(within, 0, targeted_queries([[1, 1, 1, 1]]), kv_heads=1)
    assert within.keep(0, prompt_positions(1, 1)) is None

    free = SnapKV(selection=Selection(rho=0.0, window=4, granularity="head"))
    free.begin(seq(kv_heads=1, group=1))
    assert free.budget() is None
    assert free.wants_prefill_queries == 0
    assert free.keep(0, prompt_positions(1, 1)) is None


def test_budget_follows_rho_and_must_hold_the_window() -> None:
    method = SnapKV(selection=Selection(rho=0.5, window=4, granularity="head"))
    method.begin(seq(kv_heads=1, group=1))
    assert method.budget() == 8
    too_small = SnapKV(selection=Selection(rho=0.9, window=4, granularity="head"))
    with pytest.raises(ValueError, match=r"B=1\b.*window"):
        too_small.begin(seq(kv_heads=1, group=1))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"pooling": "min"}, "pooling='min'"),
        ({"kernel_size": 4}, "kernel_size=4"),
        ({"kernel_size": 0}, "kernel_size=0"),
    ],
)
def test_bad_parameters_raise(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SnapKV(selection=Selection(rho=0.5, window=4, granularity="head"), **kwargs)


def test_snapkv_requires_head_granularity_and_a_window() -> None:
    with pytest.raises(ValueError, match="granularity='layer'"):
        SnapKV(selection=Selection(rho=0.5, window=4, granularity="layer"))
    with pytest.raises(ValueError, match="window"):
        SnapKV(selection=Selection(rho=0.5, window=0, granularity="head"))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {"kernel_size": "abc"},
            "method.kernel_size='abc' must be a positive odd integer — use e.g. method.kernel_size=7",
        ),
        ({"kernel_size": -3}, "method.kernel_size=-3 must be a positive odd integer — "),
        ({"pooling": "min"}, "method.pooling='min' is not a pooling — use one of max, avg"),
        (
            {"selection": Selection(rho=0.5, window=4, granularity="layer")},
            "method.selection.granularity='layer' does not suit SnapKV, which selects per KV head — ",
        ),
        (
            {"selection": Selection(rho=0.5, window=0, granularity="head")},
            "method.selection.window=0 leaves SnapKV no observation window — ",
        ),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: SnapKV(**{"selection": Selection(rho=0.5, window=4, granularity="head"), **options}), named)
