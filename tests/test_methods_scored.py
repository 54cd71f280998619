"""ScoredEviction driven through ``methods.driver.Driver``, the driver the engine uses, against hand-computed states.

``start`` begins a sequence and takes the prefill's ``keep(0)``; ``step`` is one decode step: the driver caches the
newest position, every layer is observed if ``observes(t)`` (with the test's weights if ``needs_attention(t)``), then
``keep(t, driver.positions)``, with ``driver.positions[layer]`` the ``(kv_heads, T)`` absolute positions now cached.
"""

from __future__ import annotations

from pathlib import Path

import hydra.utils
import pytest
import torch
from conftest import refused
from hydra import compose, initialize_config_dir
from torch import Tensor

from methods.aggregators.cumulative import Cumulative
from methods.aggregators.ema import EMA
from methods.aggregators.single_step import SingleStep
from methods.base import EvictionMethod, KeepPlan, LayerView, SequenceInfo
from methods.driver import Driver
from methods.full import FullCache
from methods.prompt_attention import prompt_attention_votes
from methods.scored import ScoredEviction
from methods.scorers.attention import AttentionScorer
from methods.scorers.recency import RecencyScorer
from methods.scorers.vnorm import VNormScorer
from methods.selection import Selection
from methods.snapkv import SnapKV

CONF = Path(__file__).resolve().parents[1] / "conf"
A = 0.8
HEAD_DIM = 2


def seq(prefill_len: int, layers: int, kv_heads: int, group: int, max_new: int = 16, numerics: int = 1) -> SequenceInfo:
    return SequenceInfo(
        prefill_len=prefill_len,
        num_layers=layers,
        num_kv_heads=kv_heads,
        num_query_heads=kv_heads * group,
        max_new_tokens=max_new,
        numerics=numerics,
    )


def start(method: EvictionMethod, info: SequenceInfo) -> Driver:
    """``begin`` and the prefill's ``keep(0)``, for methods that observe nothing at the prefill."""
    driver = Driver(method, info)
    assert driver.prefill_queries == 0, "observe the prefill through driver.observe_prefill"
    driver.end_prefill()
    return driver


def observe_layers(driver: Driver, weights: list[Tensor] | None = None) -> None:
    """Every layer's ``observe`` at the current step, if the method observes it; ``weights[layer]`` if it needs them."""
    if not driver.observing:
        return
    for layer, layer_positions in enumerate(driver.positions):
        kv_heads, length = layer_positions.shape
        view = LayerView(
            layer=layer,
            keys=torch.ones(kv_heads, length, HEAD_DIM),
            values=torch.ones(kv_heads, length, HEAD_DIM),
            positions=layer_positions,
            weights=None if weights is None or not driver.attention else weights[layer],
        )
        driver.observe(view)


def step(driver: Driver, weights: list[Tensor] | None = None) -> KeepPlan | None:
    """One decode step: the newest entry joins every layer's cache, the layers are observed, then ``keep``."""
    driver.next_step()
    observe_layers(driver, weights)
    return driver.end_step()


def spread(scores: Tensor, offsets: Tensor) -> Tensor:
    """Weights ``(kv, group, T)`` averaging to ``scores`` over all query heads (zero-mean offsets)."""
    assert abs(offsets.sum().item()) < 1e-7
    return scores[None, None, :] + offsets[:, :, None]


OFFSETS = torch.tensor([[0.01, -0.03], [0.005, 0.015]])  # per (kv head, group) shift, zero mean
S1 = [
    torch.tensor([0.10, 0.20, 0.30, 0.15, 0.05, 0.20]),
    torch.tensor([0.30, 0.10, 0.10, 0.20, 0.20, 0.10]),
    torch.tensor([0.05, 0.05, 0.40, 0.30, 0.10, 0.10]),
]
S2 = [
    torch.tensor([0.20, 0.10, 0.00, 0.30, 0.10, 0.20, 0.10]),
    torch.tensor([0.05, 0.15, 0.25, 0.05, 0.20, 0.10, 0.20]),
    torch.tensor([0.40, 0.00, 0.10, 0.10, 0.10, 0.10, 0.20]),
]


def run_two_steps(aggregator, granularity: str, numerics: int = 1) -> ScoredEviction:
    """K=3 layers, 2 KV heads x group 2, L0=5, no eviction (budget 100): two observed steps."""
    method = ScoredEviction(AttentionScorer(), aggregator, Selection(budget_tokens=100, granularity=granularity))
    driver = start(method, seq(prefill_len=5, layers=3, kv_heads=2, group=2, numerics=numerics))
    plan = step(driver, [spread(s, OFFSETS) for s in S1])
    assert plan is None
    plan = step(driver, [spread(s, OFFSETS) for s in S2])
    assert plan is None
    return method


def pad(x: Tensor, length: int) -> Tensor:
    return torch.cat([x, torch.zeros(length - x.shape[0])])


# ------------------------------------------------------------------------------------ aggregation


# Numerics 3 pools the query heads in one mean and decays a shared state once per step, and 4 folds a step's
# layers at once: the same closed forms.
@pytest.mark.parametrize("numerics", [1, 3, 4])
def test_ema_token_state_is_layer_weighted_closed_form_within_one_step(numerics) -> None:
    method = ScoredEviction(AttentionScorer(), EMA(alpha=A), Selection(budget_tokens=100))
    driver = start(method, seq(prefill_len=5, layers=3, kv_heads=2, group=2, numerics=numerics))
    step(driver, [spread(s, OFFSETS) for s in S1])
    K = 3
    expected = sum((1 - A) * A ** (K - 1 - layer) * S1[layer] for layer in range(K))
    torch.testing.assert_close(method.state[0, 0, :6], expected)
    # Hand-expanded: 0.2*0.64*s1 + 0.2*0.8*s2 + 0.2*s3.
    torch.testing.assert_close(method.state[0, 0, :6], 0.128 * S1[0] + 0.16 * S1[1] + 0.2 * S1[2])
    assert method.state.shape == (1, 1, 5 + 16 + 1)
    assert not method.state[0, 0, 6:].any()


@pytest.mark.parametrize("numerics", [1, 3, 4])
def test_ema_token_state_across_two_steps_decays_the_older_step_by_alpha_to_the_k(numerics) -> None:
    method = run_two_steps(EMA(alpha=A), "token", numerics)
    K = 3
    first = sum((1 - A) * A ** (K - 1 - layer) * S1[layer] for layer in range(K))
    second = sum((1 - A) * A ** (K - 1 - layer) * S2[layer] for layer in range(K))
    torch.testing.assert_close(method.state[0, 0, :7], A**K * pad(first, 7) + second)


@pytest.mark.parametrize("numerics", [1, 3, 4])
def test_cumulative_token_state_is_the_sum_of_all_layer_scores(numerics) -> None:
    method = run_two_steps(Cumulative(), "token", numerics)
    expected = sum(pad(s, 7) for s in S1) + sum(S2)
    torch.testing.assert_close(method.state[0, 0, :7], expected)


def test_single_step_token_state_is_the_last_layers_score() -> None:
    method = run_two_steps(SingleStep(), "token")
    torch.testing.assert_close(method.state[0, 0, :7], S2[-1])


AGGREGATORS = [EMA(alpha=0.8), EMA(alpha=0.0), Cumulative(), SingleStep()]


@pytest.mark.parametrize("count", [1, 3], ids=["shared state", "rows"])
@pytest.mark.parametrize("aggregator", AGGREGATORS, ids=repr)
def test_fold_updates_the_scored_entries_to_the_bit_as_combine_does(aggregator, count) -> None:
    # fold's fewer kernels must not move a rounding: kept sets are compared across engines to the entry.
    generator = torch.Generator().manual_seed(0)
    rows = torch.rand(count, 40, generator=generator)
    rows[:, 30:] = 0.0  # positions not cached yet
    positions = torch.stack([torch.randperm(30, generator=generator)[:12] for _ in range(count)])
    score = torch.rand(count, 12, generator=generator) / 7
    expected = aggregator.combine(rows.gather(1, positions), score)
    aggregator.fold(rows, positions, score)
    assert torch.equal(rows.gather(1, positions), expected)
    assert torch.equal(rows[:, 30:], torch.zeros(count, 10))


def shared_state_step(seed: int, layers: int = 6) -> tuple[Tensor, Tensor, Tensor]:
    """A state shared by ``layers`` layers ``(1, 40)``, 25 cached positions ``(1, 25)``, each layer's scores
    ``(layers, 1, 25)``."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.rand(1, 40, generator=generator)
    positions = torch.randperm(40, generator=generator)[None, :25]
    return rows, positions, torch.rand(layers, 1, 25, generator=generator) / 9


@pytest.mark.parametrize("aggregator", AGGREGATORS, ids=repr)
def test_fold_layers_gives_a_steps_layer_by_layer_folds(aggregator) -> None:
    rows, positions, scores = shared_state_step(seed=1)
    layers = len(scores)
    expected, regrouped = rows.clone(), rows.clone()
    for layer in range(layers):
        aggregator.fold(expected, positions, scores[layer])
        aggregator.fold_layers(regrouped, positions, scores[layer], layer, layers)
    if isinstance(aggregator, EMA) and aggregator.alpha > 0:
        # One decay of alpha^6 for six of alpha: the same sum, rounded otherwise (numerics 3).
        torch.testing.assert_close(regrouped, expected, rtol=1e-6, atol=0.0)
        assert not torch.equal(regrouped, expected)
    else:
        assert torch.equal(regrouped, expected)


@pytest.mark.parametrize("aggregator", AGGREGATORS, ids=repr)
def test_layer_coefficients_give_a_steps_layer_by_layer_folds(aggregator) -> None:
    rows, positions, scores = shared_state_step(seed=4)
    layers = len(scores)
    expected = rows.clone()
    for layer in range(layers):
        aggregator.fold(expected, positions, scores[layer])
    coefficients = aggregator.layer_coefficients(layers)
    if isinstance(aggregator, SingleStep):
        # A replacing rule is not a weighted sum of the step's scores.
        assert coefficients is None
        return
    decay, weights = coefficients
    folded = rows * decay
    folded[0, positions[0]] += sum(weight * score[0] for weight, score in zip(weights, scores, strict=True))
    torch.testing.assert_close(folded, expected, rtol=1e-6, atol=1e-7)


def test_the_attention_scorers_layer_mean_is_the_weighted_mean_of_its_pooled_scores() -> None:
    generator = torch.Generator().manual_seed(5)
    weights = torch.rand(4, 4, 3, 2, 11, generator=generator).softmax(dim=-1)  # L layers, N rows, 3 KV heads x 2
    factors = torch.tensor([0.5, 1.0, 2.0, 4.0])
    values = torch.rand(4, 3, 11, 5, generator=generator)
    # VNorm pools by the default (its scores' mean over the KV heads, then the layers'), for one sequence.
    for scorer, cases in ((AttentionScorer(), (weights[:, 0], weights)), (VNormScorer(), (weights[:, 0],))):
        for stacked in cases:
            views = [
                LayerView(layer, keys=None, values=values[layer], positions=None, weights=layer_weights)
                for layer, layer_weights in enumerate(stacked)
            ]
            expected = sum(factor * scorer.pooled(view) for factor, view in zip(factors, views, strict=True)) / 4
            mean = scorer.layer_mean(views, factors)
            assert mean.shape == expected.shape == (*stacked.shape[1:-3], 1, 11)
            torch.testing.assert_close(mean, expected, rtol=1e-6, atol=1e-8)


def test_the_attention_scorers_pooled_score_is_the_mean_of_its_heads_scores() -> None:
    generator = torch.Generator().manual_seed(2)
    weights = torch.rand(4, 3, 2, 11, generator=generator).softmax(dim=-1)  # N rows, 3 KV heads x group 2
    scorer = AttentionScorer()
    for view_weights in (weights[0], weights):
        view = LayerView(layer=0, keys=None, values=None, positions=None, weights=view_weights)
        pooled = scorer.pooled(view)
        assert pooled.shape == (*view_weights.shape[:-3], 1, 11)
        torch.testing.assert_close(pooled, scorer.score(view).mean(dim=-2, keepdim=True), rtol=1e-6, atol=0.0)
    # A scorer that does not pool itself gives the mean of its scores exactly.
    keys, values = torch.rand(3, 11, 2), torch.rand(3, 11, 2)
    view = LayerView(layer=0, keys=keys, values=values, positions=None, weights=weights[0])
    vnorm = VNormScorer()
    vnorm.begin(seq(prefill_len=11, layers=1, kv_heads=3, group=2))
    assert torch.equal(vnorm.pooled(view), vnorm.score(view).mean(dim=-2, keepdim=True))


def test_ema_layer_granularity_keeps_one_independent_state_per_layer() -> None:
    method = run_two_steps(EMA(alpha=A), "layer")
    assert method.state.shape[:2] == (3, 1)
    for layer in range(3):
        expected = A * (1 - A) * pad(S1[layer], 7) + (1 - A) * S2[layer]
        torch.testing.assert_close(method.state[layer, 0, :7], expected)


def test_ema_head_granularity_keeps_one_independent_state_per_layer_and_head() -> None:
    method = run_two_steps(EMA(alpha=A), "head")
    assert method.state.shape[:2] == (3, 2)
    group_mean = OFFSETS.mean(dim=1)  # -0.01 for head 0, +0.01 for head 1
    for layer in range(3):
        for head in range(2):
            first = pad(S1[layer] + group_mean[head], 7)
            second = S2[layer] + group_mean[head]
            torch.testing.assert_close(method.state[layer, head, :7], A * (1 - A) * first + (1 - A) * second)


# ------------------------------------------------------------------------------------ granularity


def test_token_granularity_keep_is_one_set_shared_by_all_layers() -> None:
    method = ScoredEviction(AttentionScorer(), SingleStep(), Selection(budget_tokens=3))
    driver = start(method, seq(prefill_len=4, layers=2, kv_heads=2, group=1))
    layer0 = torch.tensor([0.10, 0.90, 0.10, 0.80, 0.10])
    layer1 = torch.tensor([0.30, 0.05, 0.60, 0.15, 0.20])
    w = [layer0.expand(2, 1, -1), layer1.expand(2, 1, -1)]
    plan = step(driver, w)
    # SingleStep under shared state: the last layer overwrites the first; one set for all layers.
    assert plan is not None and len(plan) == 2
    assert plan[0].dim() == 1
    assert plan[0].tolist() == plan[1].tolist() == [0, 2, 4]
    assert driver.positions[0].tolist() == driver.positions[1].tolist() == [[0, 2, 4], [0, 2, 4]]


def test_layer_granularity_keep_sets_are_independent_per_layer() -> None:
    method = ScoredEviction(AttentionScorer(), SingleStep(), Selection(budget_tokens=4, granularity="layer"))
    driver = start(method, seq(prefill_len=6, layers=2, kv_heads=2, group=1))
    # Per layer the two KV heads disagree; only their mean decides.
    layer0 = torch.tensor([[[0.4, 0.0, 0.3, 0.1, 0.0, 0.1, 0.1]], [[0.0, 0.4, 0.1, 0.3, 0.1, 0.0, 0.1]]])
    layer1 = torch.tensor([[[0.0, 0.0, 0.1, 0.3, 0.2, 0.2, 0.2]], [[0.1, 0.0, 0.0, 0.1, 0.2, 0.3, 0.3]]])
    plan = step(driver, [layer0, layer1])
    assert plan is not None
    assert plan[0].tolist() == [0, 1, 2, 3]
    assert plan[1].tolist() == [3, 4, 5, 6]
    assert driver.positions[0].tolist() == [[0, 1, 2, 3]] * 2
    assert driver.positions[1].tolist() == [[3, 4, 5, 6]] * 2


def test_head_granularity_keep_returns_per_head_sets_of_equal_count() -> None:
    method = ScoredEviction(AttentionScorer(), SingleStep(), Selection(budget_tokens=4, granularity="head"))
    driver = start(method, seq(prefill_len=8, layers=2, kv_heads=2, group=1))
    w0 = torch.tensor(
        [
            [[0.90, 0.10, 0.80, 0.20, 0.70, 0.30, 0.60, 0.40, 0.00]],
            [[0.10, 0.90, 0.20, 0.80, 0.30, 0.70, 0.40, 0.60, 0.00]],
        ]
    )
    w1 = torch.tensor(
        [
            [[0.00, 0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70, 0.80]],
            [[0.80, 0.70, 0.60, 0.50, 0.40, 0.30, 0.20, 0.10, 0.00]],
        ]
    )
    plan = step(driver, [w0, w1])
    assert plan is not None
    assert [p.shape for p in plan] == [(2, 4), (2, 4)]
    assert plan[0].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert plan[1].tolist() == [[5, 6, 7, 8], [0, 1, 2, 3]]
    assert driver.positions[0].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]

    # Step 2: each head's cache now holds different positions; scores land on those positions.
    w0 = torch.tensor([[[0.1, 0.5, 0.4, 0.3, 0.2]], [[0.5, 0.4, 0.3, 0.2, 0.1]]])
    w1 = torch.tensor([[[0.5, 0.1, 0.4, 0.3, 0.2]], [[0.3, 0.2, 0.1, 0.5, 0.4]]])
    plan = step(driver, [w0, w1])
    assert plan[0].tolist() == [[1, 2, 3, 4], [0, 1, 2, 3]]
    assert plan[1].tolist() == [[0, 2, 3, 4], [0, 1, 3, 4]]
    assert driver.positions[0].tolist() == [[2, 4, 6, 9], [1, 3, 5, 7]]
    assert driver.positions[1].tolist() == [[5, 7, 8, 9], [0, 1, 3, 9]]
    # State lives over absolute positions, per layer and head.
    assert method.state[0, 0, 2].item() == pytest.approx(0.5)
    assert method.state[1, 1, 3].item() == pytest.approx(0.5)


# ------------------------------------------------------------------------------------ keep timing


def test_keep_is_none_at_step_zero_and_within_budget() -> None:
    method = ScoredEviction(AttentionScorer(), EMA(), Selection(budget_tokens=5))
    driver = Driver(method, seq(prefill_len=20, layers=2, kv_heads=1, group=1))
    # Over budget after the prefill, but decode-time methods never evict at step 0.
    assert driver.end_prefill() is None

    driver = start(method, seq(prefill_len=3, layers=2, kv_heads=1, group=1))
    w = [torch.full((1, 1, 4), 0.25)] * 2
    plan = step(driver, w)
    assert plan is None  # 4 <= 5
    plan = step(driver, [torch.full((1, 1, 5), 0.2)] * 2)
    assert plan is None  # 5 <= 5
    plan = step(driver, [torch.tensor([[[0.3, 0.1, 0.2, 0.2, 0.1, 0.1]]])] * 2)
    assert plan is not None and driver.positions[0].shape == (1, 5)


def test_begin_resets_state_per_sequence() -> None:
    method = run_two_steps(Cumulative(), "token")
    assert method.state.any()
    method.begin(seq(prefill_len=30, layers=3, kv_heads=2, group=2, max_new=4))
    assert method.state.shape == (1, 1, 30 + 4 + 1)
    assert not method.state.any()


# ------------------------------------------------------------------------------------ lazy refresh

# One layer, one head, L0=6, budget 5, EMA(0.8): the hand-computed trajectory.
W1 = torch.tensor([0.30, 0.05, 0.20, 0.10, 0.15, 0.02, 0.18])  # positions 0..6
M1 = {0: 0.06, 1: 0.01, 2: 0.04, 3: 0.02, 4: 0.03, 5: 0.004, 6: 0.036}  # 0.2 * W1


def lazy(**kwargs) -> Driver:
    method = ScoredEviction(AttentionScorer(), EMA(alpha=A), Selection(budget_tokens=5), **kwargs)
    return start(method, seq(prefill_len=6, layers=1, kv_heads=1, group=1))


def state_at(method: ScoredEviction, positions: list[int]) -> Tensor:
    return method.state[0, 0, positions]


def test_lazy_refresh_observes_exactly_on_steps_one_plus_multiples_of_r() -> None:
    method = lazy(refresh_every=4).method
    observed = [t for t in range(1, 30) if method.observes(t)]
    assert observed == [1, 5, 9, 13, 17, 21, 25, 29]
    assert [t for t in range(1, 30) if method.needs_attention(t)] == observed
    every = lazy(refresh_every=1).method
    assert all(every.observes(t) for t in range(1, 30))


def test_lazy_refresh_inits_new_entries_with_the_mean_and_evicts_every_step_on_stale_state() -> None:
    driver = lazy(refresh_every=4)
    method = driver.method
    plan = step(driver, [W1[None, None]])
    torch.testing.assert_close(state_at(method, list(range(7))), torch.tensor(list(M1.values())))
    assert driver.positions[0].tolist() == [[0, 2, 3, 4, 6]]

    # Step 2 (skipped): the new entry 7 gets the mean state of the other cached entries.
    plan = step(driver, [torch.tensor([[[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]])])
    mean2 = (0.06 + 0.04 + 0.02 + 0.03 + 0.036) / 5  # 0.0372
    assert state_at(method, [7]).item() == pytest.approx(mean2)
    assert plan is not None and driver.positions[0].tolist() == [[0, 2, 4, 6, 7]]  # 3 (0.02) evicted
    # The attention that favoured position 3 on the skipped step was never seen.
    torch.testing.assert_close(state_at(method, [0, 2, 3, 4, 6]), torch.tensor([0.06, 0.04, 0.02, 0.03, 0.036]))

    plan = step(driver)
    mean3 = (0.06 + 0.04 + 0.03 + 0.036 + mean2) / 5  # 0.04064
    assert state_at(method, [8]).item() == pytest.approx(mean3)
    assert plan is not None and driver.positions[0].tolist() == [[0, 2, 6, 7, 8]]  # 4 (0.03) evicted

    plan = step(driver)
    mean4 = (0.06 + 0.04 + 0.036 + mean2 + mean3) / 5  # 0.042768
    assert state_at(method, [9]).item() == pytest.approx(mean4)
    assert plan is not None and driver.positions[0].tolist() == [[0, 2, 7, 8, 9]]  # 6 (0.036) evicted

    # Step 5 observes again: EMA on top of the stale state; the new entry 10 starts from m0 = 0.
    w5 = torch.tensor([0.05, 0.05, 0.10, 0.30, 0.20, 0.30])  # over positions 0, 2, 7, 8, 9, 10
    plan = step(driver, [w5[None, None]])
    old = torch.tensor([0.06, 0.04, mean2, mean3, mean4, 0.0])
    m5 = A * old + (1 - A) * w5  # .058 .042 .04976 .092512 .0742144 .06
    torch.testing.assert_close(state_at(method, [0, 2, 7, 8, 9, 10]), m5)
    assert plan is not None and driver.positions[0].tolist() == [[0, 7, 8, 9, 10]]  # 2 (0.042) evicted

    plan = step(driver)
    mean6 = (m5[0] + m5[2] + m5[3] + m5[4] + m5[5]).item() / 5  # 0.06689728
    assert state_at(method, [11]).item() == pytest.approx(mean6)
    assert plan is not None and driver.positions[0].tolist() == [[0, 8, 9, 10, 11]]  # 7 (0.04976) evicted


def test_lazy_mean_init_is_per_row_under_head_granularity() -> None:
    method = ScoredEviction(
        AttentionScorer(), Cumulative(), Selection(budget_tokens=100, granularity="head"), refresh_every=2
    )
    driver = start(method, seq(prefill_len=4, layers=2, kv_heads=2, group=1))
    w0 = torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.0]], [[0.5, 0.5, 0.0, 0.0, 0.0]]])
    w1 = torch.tensor([[[1.0, 0.0, 0.0, 0.0, 0.0]], [[0.2, 0.2, 0.2, 0.2, 0.2]]])
    step(driver, [w0, w1])
    assert not method.observes(2)
    step(driver)
    expected = torch.tensor([[0.2, 0.2], [0.2, 0.2]])  # row sums (1.0) over 5 other entries
    torch.testing.assert_close(method.state[:, :, 5], expected)


# ------------------------------------------------------------------------------------ score-free


def test_score_free_observes_only_at_the_first_decode_step() -> None:
    method = lazy(score_once=True).method
    assert [t for t in range(0, 40) if method.observes(t)] == [1]
    assert [t for t in range(0, 40) if method.needs_attention(t)] == [1]


@pytest.mark.parametrize("later", ["uniform", "adversarial"])
def test_score_free_freezes_the_first_step_ranking_and_gives_new_entries_the_mean(later: str) -> None:
    driver = lazy(score_once=True)
    method = driver.method
    step(driver, [W1[None, None]])
    assert driver.positions[0].tolist() == [[0, 2, 3, 4, 6]]
    trajectory = []
    means = []
    for t in range(2, 7):
        driver.next_step()  # the newest entry, position 6 + t - 1, joins the cache
        positions = driver.positions
        length = positions[0].shape[1]
        if later == "uniform":
            weights = torch.full((1, 1, length), 1 / length)
        else:  # all attention on the entry the frozen ranking evicts next
            weights = torch.zeros(1, 1, length)
            weights[0, 0, 2] = 1.0
        others = state_at(method, positions[0][0, :-1].tolist())
        means.append(others.mean().item())
        observe_layers(driver, [weights])
        plan = driver.end_step()
        assert plan is not None
        assert state_at(method, [6 + t - 1]).item() == pytest.approx(means[-1])
        trajectory.append(driver.positions[0][0].tolist())
    assert means[:2] == pytest.approx([0.0372, 0.04064])
    assert trajectory == [
        [0, 2, 4, 6, 7],  # 3 evicted
        [0, 2, 6, 7, 8],  # 4
        [0, 2, 7, 8, 9],  # 6
        [0, 2, 8, 9, 10],  # 7 (mean 0.0372)
        [0, 8, 9, 10, 11],  # 2 (0.04)
    ]
    # The prefill entries kept their step-1 state throughout.
    torch.testing.assert_close(state_at(method, [0, 2]), torch.tensor([0.06, 0.04]))


def test_score_free_first_step_evicts_by_the_step_one_scores() -> None:
    plan = step(lazy(score_once=True), [W1[None, None]])
    assert plan is not None and plan[0].tolist() == [0, 2, 3, 4, 6]


# ------------------------------------------------------------------------------------ StreamingLLM


def test_streaming_llm_keeps_four_sinks_and_the_most_recent() -> None:
    method = compose_method("method=streaming_llm", "rho=0.5")
    driver = Driver(method, seq(prefill_len=20, layers=2, kv_heads=2, group=2))
    assert method.budget() == 10
    assert method.observes(1) and not method.needs_attention(1)
    assert driver.end_prefill() is None
    for t in range(1, 6):
        newest = 20 + t - 1
        plan = step(driver)  # no attention weights at all
        assert plan is not None
        expected = [0, 1, 2, 3, *range(newest - 5, newest + 1)]
        for layer_positions in driver.positions:
            assert layer_positions.tolist() == [expected, expected]


# ------------------------------------------------------------------------------------ named methods


def compose_method(*overrides: str):
    with initialize_config_dir(version_base=None, config_dir=str(CONF)):
        cfg = compose(config_name="config", overrides=list(overrides))
    return hydra.utils.instantiate(cfg.method)


NAMED = {
    # name: (scorer, aggregator, granularity, refresh_every, score_once, sinks, recent_fraction)
    "inertia": (AttentionScorer, EMA, "token", 1, False, 0, 0.0),
    "inertia_lazy": (AttentionScorer, EMA, "token", 4, False, 0, 0.0),
    "score_free": (AttentionScorer, EMA, "token", 1, True, 0, 0.0),
    "cumulative": (AttentionScorer, Cumulative, "token", 1, False, 0, 0.0),
    "single_step": (AttentionScorer, SingleStep, "token", 1, False, 0, 0.0),
    "tova_decode": (AttentionScorer, SingleStep, "layer", 1, False, 0, 0.0),
    "h2o": (AttentionScorer, Cumulative, "head", 1, False, 0, 0.5),
    "streaming_llm": (RecencyScorer, SingleStep, "token", 1, False, 4, 0.0),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_scored_methods_are_the_documented_compositions(name: str) -> None:
    scorer, aggregator, granularity, refresh_every, score_once, sinks, recent_fraction = NAMED[name]
    method = compose_method(f"method={name}")
    assert type(method) is ScoredEviction
    assert method.name == name
    assert type(method.scorer) is scorer
    assert type(method.aggregator) is aggregator
    if aggregator is EMA:
        assert method.aggregator.alpha == pytest.approx(0.8)
    assert method.selection.granularity == granularity
    assert method.refresh_every == refresh_every
    assert method.score_once is score_once
    assert method.selection.sinks == sinks
    assert method.selection.window == 0
    assert method.selection.recent_fraction == recent_fraction
    assert method.selection.rho == pytest.approx(0.9)
    assert method.selection.budget_tokens is None
    assert method.prefill_attention is (name == "h2o")


def test_named_tova_is_the_papers_prefill_form() -> None:
    method = compose_method("method=tova")
    assert type(method.scorer) is AttentionScorer and type(method.aggregator) is SingleStep
    assert method.selection.granularity == "layer" and method.selection.window == 1
    assert method.prefill_attention and method.prefill_window == 1 and not method.decode_eviction


def test_named_full_and_snapkv() -> None:
    full = compose_method("method=full")
    assert type(full) is FullCache and full.budget() is None
    snapkv = compose_method("method=snapkv", "rho=0.75")
    assert type(snapkv) is SnapKV
    assert (snapkv.kernel_size, snapkv.pooling) == (7, "max")
    assert snapkv.selection.window == 32
    assert snapkv.selection.granularity == "head"
    assert snapkv.selection.rho == pytest.approx(0.75)


def test_scorer_override_swaps_only_the_scorer() -> None:
    method = compose_method("method=inertia", "method/scorer=vnorm")
    assert type(method.scorer) is VNormScorer
    assert type(method.aggregator) is EMA and method.selection.granularity == "token"
    lazy = compose_method("method=inertia_lazy", "method/scorer=recency")
    assert type(lazy.scorer) is RecencyScorer and lazy.refresh_every == 4


def test_named_inertia_budget_follows_rho() -> None:
    method = compose_method("method=inertia")
    method.begin(seq(prefill_len=1000, layers=2, kv_heads=1, group=1))
    assert method.budget() == 100


# ------------------------------------------------------------------------ prompt attention (H2O)


def naive_votes(queries: Tensor, keys: Tensor, scaling: float) -> Tensor:
    """Column sums of the full causal softmax, query head by query head, then the group mean."""
    heads, count, _ = queries.shape
    kv_heads, length, _ = keys.shape
    group = heads // kv_heads
    out = torch.zeros(kv_heads, length)
    for head in range(heads):
        logits = queries[head] @ keys[head // group].T * scaling
        for row in range(count):
            visible = length - count + row + 1
            out[head // group, :visible] += torch.softmax(logits[row, :visible], dim=0) / group
    return out


@pytest.mark.parametrize("count", [9, 3])
def test_prompt_attention_votes_are_causal_column_sums_in_any_chunking(count: int) -> None:
    torch.manual_seed(0)
    keys, queries = torch.randn(2, 9, 4), torch.randn(4, count, 4)
    view = LayerView(
        layer=0, keys=keys, values=keys, positions=torch.arange(9).expand(2, -1), queries=queries, scaling=0.5
    )
    expected = naive_votes(queries, keys, 0.5)
    for chunk_elements in (1, 4 * 9 * 2, 1 << 26):
        torch.testing.assert_close(prompt_attention_votes(view, chunk_elements), expected)
    # Every query's weights sum to one: the votes add up to the number of queries, per KV head.
    torch.testing.assert_close(expected.sum(dim=1), torch.full((2,), float(count)))


def test_h2o_counts_the_prompt_queries_and_evicts_after_the_prefill() -> None:
    torch.manual_seed(0)
    method = compose_method("method=h2o", "method.selection.budget_tokens=6")
    info = seq(prefill_len=10, layers=2, kv_heads=2, group=2)
    driver = Driver(method, info)
    assert method.wants_prefill_queries == 10
    votes, plan = [], []
    for layer in range(2):
        keys, queries = torch.randn(2, 10, 4), torch.randn(4, 10, 4)
        positions = driver.positions[layer]
        view = LayerView(layer=layer, keys=keys, values=keys, positions=positions, queries=queries, scaling=0.5)
        # Per-head sets depend on the layer's own votes: the layer is cut inside the prefill.
        plan.append(driver.observe_prefill(view))
        votes.append(naive_votes(queries, keys, 0.5))
    torch.testing.assert_close(method.state[:, :, :10], torch.stack(votes))
    assert driver.end_prefill() is None
    # Half the budget is the recent window (7, 8, 9); the other three are each head's top votes.
    for layer in range(2):
        for head in range(2):
            older = votes[layer][head, :7].topk(3).indices.sort().values.tolist()
            assert plan[layer][head].tolist() == [*older, 7, 8, 9]
            assert driver.positions[layer][head].tolist() == [*older, 7, 8, 9]
    # Decode steps then add the step's attention to the prompt's votes.
    weights = [torch.full((2, 2, 7), 1 / 7)] * 2
    before = method.state[:, :, :11].clone()
    driver.next_step()  # the kept six and the newest entry, position 10
    rows = driver.positions[0]
    observe_layers(driver, weights)
    driver.end_step()
    torch.testing.assert_close(method.state[0].gather(1, rows), before[0].gather(1, rows) + 1 / 7)


def test_prefill_attention_needs_the_attention_scorer() -> None:
    with pytest.raises(ValueError, match="prefill_attention.*VNormScorer"):
        ScoredEviction(VNormScorer(), Cumulative(), Selection(rho=0.5), prefill_attention=True)
    without = compose_method("method=inertia")
    driver = Driver(without, seq(prefill_len=10, layers=2, kv_heads=2, group=2))
    assert without.wants_prefill_queries == 0 and driver.end_prefill() is None


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (
            lambda: EMA(alpha="abc"),
            "method.aggregator.alpha='abc' must be a number in [0, 1) — use e.g. method.aggregator.alpha=0.8",
        ),
        (lambda: EMA(alpha=1.0), "method.aggregator.alpha=1.0 must be a number in [0, 1) — "),
        (lambda: EMA(alpha=True), "method.aggregator.alpha=True must be a number in [0, 1) — "),
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), refresh_every="abc"),
            "method.refresh_every='abc' must be an integer >= 1 — use e.g. method.refresh_every=4",
        ),
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), refresh_every=0),
            "method.refresh_every=0 must be an integer >= 1 — ",
        ),
        (
            lambda: ScoredEviction(VNormScorer(), Cumulative(), Selection(rho=0.5), prefill_attention=True),
            "method.prefill_attention=true observes attention weights, which VNormScorer does not score — ",
        ),
    ],
)
def test_bad_options_name_the_option_and_the_fix(build, named: str) -> None:
    refused(lambda: build(), named)


def test_checking_a_sequence_changes_nothing_and_gives_its_budget():
    method = compose_method("method=inertia", "rho=0.5")
    assert method.check(seq(prefill_len=100, layers=2, kv_heads=1, group=1)) == 50
    assert not hasattr(method, "state") and not hasattr(method, "_budget")
    tight = compose_method("method=inertia", "rho=0.5", "method.selection.sinks=60")
    with pytest.raises(ValueError, match="is smaller than sinks"):
        tight.check(seq(prefill_len=100, layers=2, kv_heads=1, group=1))
