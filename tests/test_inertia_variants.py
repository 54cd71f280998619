"""InertiaKV's variants and the paper's TOVA, driven through ``methods.driver.Driver`` against hand-computed values.

TOVA as the paper ran it (last prompt query, cut at the prefill, the cache then grows), the fixed target size with a
compression interval (Table 11), the static reserve and first-eviction rescue (App. B), and App. H's adaptive-alpha
selector and reactive trigger.
"""

from __future__ import annotations

import pytest
import torch
from conftest import named_method, refused
from test_methods_scored import observe_layers, seq, start, step

from methods.aggregators.adaptive import AdaptiveEMA, choose, risk
from methods.aggregators.base import top_k, top_positions
from methods.aggregators.ema import EMA
from methods.aggregators.reactive import ReactiveEMA
from methods.aggregators.single_step import SingleStep
from methods.base import LayerView
from methods.driver import Driver
from methods.overlap import jaccard, tensor_jaccard
from methods.prompt_attention import prompt_attention_votes
from methods.scored import ScoredEviction
from methods.scorers.attention import AttentionScorer
from methods.scorers.keynorm import KeyNormScorer
from methods.selection import Selection


# ------------------------------------------------------------------------------------ TOVA (paper)
def test_paper_tova_keeps_the_last_prompt_querys_top_entries_per_layer_and_then_grows() -> None:
    torch.manual_seed(0)
    method = named_method("tova", "method.selection.budget_tokens=4")
    info = seq(prefill_len=8, layers=2, kv_heads=2, group=2)
    driver = Driver(method, info)
    assert method.wants_prefill_queries == 1  # only the last prompt query votes
    expected = []
    for layer in range(2):
        keys, queries = torch.randn(2, 8, 4), torch.randn(4, 1, 4)
        view = LayerView(layer, keys, keys, driver.positions[layer], queries=queries, scaling=0.5)
        keep = driver.observe_prefill(view)
        # The last query's softmax over all 8 keys, averaged over the 4 query heads; position 7 (the
        # last prompt token) is protected, the other three slots go to the highest of 0..6.
        weights = torch.stack([torch.softmax(queries[h, 0] @ keys[h // 2].T * 0.5, dim=0) for h in range(4)])
        top = weights.mean(dim=0)[:7].topk(3).indices.sort().values.tolist()
        expected.append([*top, 7])
        # Cut inside the prefill, layer by layer (one set for both KV heads of the layer).
        assert keep is not None and keep.tolist() == expected[-1]
        assert driver.positions[layer].tolist() == [expected[-1]] * 2
        torch.testing.assert_close(method.state[layer, 0, :8], prompt_attention_votes(view).mean(dim=0))
    assert driver.end_prefill() is None
    for t in range(1, 4):
        assert not method.observes(t) and not method.needs_attention(t)
        assert step(driver) is None
        assert driver.positions[0].tolist() == [[*expected[0], *range(8, 8 + t)]] * 2
    assert method.budget() == 4


def test_tova_decode_is_todays_decode_time_form() -> None:
    method = named_method("tova_decode", "method.selection.budget_tokens=3")
    driver = start(method, seq(prefill_len=4, layers=1, kv_heads=1, group=1))
    plan = step(driver, [torch.tensor([[[0.1, 0.4, 0.2, 0.0, 0.3]]])])
    assert plan[0].tolist() == [1, 2, 4]


def test_tova_decode_eviction_continues_per_step() -> None:
    method = named_method("tova", "method.selection.budget_tokens=3", "method.decode_eviction=true")
    driver = Driver(method, seq(prefill_len=4, layers=1, kv_heads=1, group=1))
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]])
    view = LayerView(0, keys, keys, driver.positions[0], queries=torch.tensor([[[1.0, 0.0]]]), scaling=1.0)
    driver.observe_prefill(view)
    assert driver.positions[0].tolist() == [[0, 2, 3]]  # logits 1, 0, 2, 0: position 1 goes, 3 is protected
    assert method.observes(1)
    plan = step(driver, [torch.tensor([[[0.5, 0.1, 0.2, 0.2]]])])
    assert plan[0].tolist() == [0, 2, 3]  # position 2 (0.1) evicted; the newest (3) is protected
    assert driver.positions[0].tolist() == [[0, 3, 4]]


# ------------------------------------------------------------------------------------ fixed target + interval
def test_fixed_budget_cuts_back_to_the_target_every_c_steps_and_grows_in_between() -> None:
    method = named_method(
        "fixed_budget", "method.selection.budget_tokens=3", "method.compress_every=3", "method/scorer=keynorm"
    )
    assert type(method.scorer) is KeyNormScorer and type(method.aggregator) is SingleStep
    driver = start(method, seq(prefill_len=6, layers=1, kv_heads=1, group=1))
    lengths = []
    for _ in range(7):
        assert method.observes(driver.step + 1)  # scored every step
        plan = step(driver)
        lengths.append(driver.positions[0].shape[-1])
        assert (plan is not None) == (driver.step % 3 == 0)
    # Steps 1, 2 grow (7, 8), step 3 cuts 9 to 3, steps 4, 5 grow, step 6 cuts, step 7 grows.
    assert lengths == [7, 8, 3, 4, 5, 3, 4]


def test_score_at_compression_observes_only_on_the_cuts() -> None:
    method = ScoredEviction(
        AttentionScorer(), EMA(), Selection(budget_tokens=3), compress_every=4, score_at_compression=True
    )
    start(method, seq(prefill_len=6, layers=1, kv_heads=1, group=1))
    assert [t for t in range(1, 13) if method.observes(t)] == [4, 8, 12]


# ------------------------------------------------------------------------------------ App. B
def test_static_reserve_protects_evenly_spaced_prompt_positions() -> None:
    selection = Selection(budget_tokens=5, reserve_fraction=0.4)
    assert selection.reserve(5, 20).tolist() == [0, 10]  # floor(0.4 * 5) = 2 of 20 prompt positions
    method = ScoredEviction(AttentionScorer(), SingleStep(), selection)
    driver = start(method, seq(prefill_len=20, layers=1, kv_heads=1, group=1))
    scores = torch.zeros(21)
    scores[[3, 4, 5, 6, 7]] = torch.tensor([0.5, 0.4, 0.3, 0.2, 0.1])
    plan = step(driver, [scores[None, None]])
    # 0 and 10 are held whatever their score; the other three slots go to the highest: 3, 4, 5.
    assert plan[0].tolist() == [0, 3, 4, 5, 10]


def test_reserve_counts_towards_the_budget_check() -> None:
    message = refused(lambda: Selection(budget_tokens=4, window=3, reserve_fraction=0.5).budget_for(100), "reserve")
    assert "sinks+window=0+3+reserve 2=5" in message


def test_first_eviction_rescue_keeps_the_highest_single_layer_scores_once() -> None:
    method = ScoredEviction(AttentionScorer(), EMA(alpha=0.5), Selection(budget_tokens=4), rescue_fraction=0.5)
    driver = start(method, seq(prefill_len=6, layers=2, kv_heads=1, group=1))
    layer0 = torch.tensor([0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.1])
    layer1 = torch.tensor([0.3, 0.0, 0.25, 0.2, 0.15, 0.1, 0.0])
    plan = step(driver, [layer0[None, None], layer1[None, None]])
    # State (alpha 0.5, layer-sequential): 0.5*(0.5*l0) + 0.5*l1 = .15 .225 .125 .1 .075 .05 .025.
    torch.testing.assert_close(method.state[0, 0, :7], torch.tensor([0.15, 0.225, 0.125, 0.1, 0.075, 0.05, 0.025]))
    # B=4, rescue floor(0.5*4)=2: the state's top two (1, 0), then the two highest single-layer
    # peaks among the rest: position 2 (0.25 at layer 1) and 3 (0.2) (6's 0.1 and 4's 0.15 lose).
    assert plan[0].tolist() == [0, 1, 2, 3]
    # Later evictions follow the state alone.
    plan = step(driver, [torch.tensor([[[0.0, 0.0, 0.0, 0.0, 1.0]]])] * 2)
    assert plan[0].tolist() == [0, 1, 2, 4]  # 3 (lowest state) evicted, the newest kept


def test_aux_variant_composes_reserve_and_rescue() -> None:
    method = named_method("inertia_aux")
    assert method.rescue_fraction == pytest.approx(0.1) and method.selection.reserve_fraction == pytest.approx(0.1)
    assert type(method.aggregator) is EMA and method.aggregator.alpha == pytest.approx(0.8)
    reserve, rescue = named_method("inertia_reserve"), named_method("inertia_rescue")
    assert (reserve.rescue_fraction, reserve.selection.reserve_fraction) == (0.0, pytest.approx(0.1))
    assert (rescue.rescue_fraction, rescue.selection.reserve_fraction) == (pytest.approx(0.1), 0.0)


# ------------------------------------------------------------------------------------ App. H
def test_risk_and_choice_by_hand() -> None:
    # eta = 50: (1-a)/(1+a)*2500 + (a/(1-a))^2 -> a=0.8: 277.8 + 16; a=0.95: 64.1 + 361; a=0.5: 833.3 + 1.
    assert risk(0.8, 50) == pytest.approx(0.2 / 1.8 * 2500 + 16)
    assert choose(50, [0.0, 0.3, 0.5, 0.8, 0.95]) == 0.8
    assert choose(600, [0.0, 0.3, 0.5, 0.8, 0.95]) == 0.95
    assert choose(1.0, [0.0, 0.3, 0.5, 0.8, 0.95]) == 0.3  # 0.538+0.184 < 0.333+1 < 1+0
    assert choose(float("inf"), [0.0, 0.8, 0.9]) == 0.9


def test_top_sets_and_overlap() -> None:
    assert top_positions(torch.tensor([10, 11, 12, 13]), torch.tensor([0.1, 0.4, 0.3, 0.2]), 2).tolist() == [11, 12]
    assert tensor_jaccard(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])) == pytest.approx(0.5)
    assert tensor_jaccard(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)) == 1.0
    assert jaccard([1, 2, 3], {2, 3, 4}) == pytest.approx(0.5) and jaccard([], set()) == 1.0
    assert top_k(51, 0.1) == 6 and top_k(50, 0.1) == 5 and top_k(3, 0.1) == 1


def test_adaptive_alpha_measures_noise_and_drift_then_fixes_alpha() -> None:
    aggregator = AdaptiveEMA(warmup=2, candidates=[0.3, 0.8], top_fraction=0.5)
    method = ScoredEviction(AttentionScorer(), aggregator, Selection(budget_tokens=4))
    driver = start(method, seq(prefill_len=6, layers=2, kv_heads=1, group=1))
    # Step 1: k = ceil(0.5*4) = 2; layer tops {0, 1} and {1, 2}: disagreement 1 - 1/3.
    l0 = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05, 0.0])
    l1 = torch.tensor([0.1, 0.4, 0.3, 0.1, 0.05, 0.05, 0.0])
    step(driver, [l0[None, None], l1[None, None]])
    assert aggregator.current == 0.8 and aggregator.chosen is None
    # The state after step 1 (alpha 0.8): .2*(.8*l0... ) -> top-4 retained {0, 1, 2, 3}.
    assert driver.positions[0].tolist() == [[0, 1, 2, 3]]
    # Step 2: both layers agree on {0, 1}; the newest entry (7) does not enter the top-4: no drift.
    w = torch.tensor([0.4, 0.4, 0.1, 0.1, 0.0])
    step(driver, [w[None, None], w[None, None]])
    report = aggregator.report()
    assert report["sigma"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert report["delta"] == 0.0 and report["eta"] is None  # no drift: eta infinite, the largest alpha
    assert aggregator.chosen == 0.8 and aggregator.current == 0.8
    method.begin(seq(prefill_len=6, layers=2, kv_heads=1, group=1))
    assert aggregator.chosen is None and aggregator.report()["sigma"] is None


def test_reactive_trigger_lowers_alpha_for_the_next_step() -> None:
    aggregator = ReactiveEMA(alpha=0.8, low_alpha=0.0, threshold=0.5, top_fraction=0.5)
    method = ScoredEviction(AttentionScorer(), aggregator, Selection(budget_tokens=4))
    driver = start(method, seq(prefill_len=4, layers=1, kv_heads=1, group=1))
    step(driver, [torch.tensor([[[0.5, 0.3, 0.1, 0.1, 0.0]]])])  # raw and state agree: no trigger
    assert aggregator.current == 0.8 and aggregator.triggers == 0
    before = method.state[0, 0, :6].clone()
    # Step 2 over cached 0, 1, 2, 3, 5: the state becomes .08 .048 .036 .046 .04, whose top-2 {0, 1}
    # share nothing with the raw top-2 {5, 3}: disagreement 1 > 0.5, so the next step uses alpha 0.
    w2 = torch.tensor([0.0, 0.0, 0.1, 0.15, 0.2])
    observe = [w2[None, None]]
    plan = step(driver, observe)
    cached = [0, 1, 2, 3, 5]
    torch.testing.assert_close(method.state[0, 0, cached], 0.8 * before[cached] + 0.2 * w2)
    assert aggregator.triggers == 1 and aggregator.current == 0.0
    assert plan is not None and driver.positions[0].tolist() == [[0, 1, 3, 5]]  # 2 (.036) evicted
    kept = driver.positions[0][0].tolist()
    w3 = torch.tensor([0.1, 0.2, 0.3, 0.3, 0.1])
    driver.next_step()
    observe_layers(driver, [w3[None, None]])
    # alpha 0: the state of every cached entry is now this step's score.
    torch.testing.assert_close(method.state[0, 0, [*kept, 6]], w3)
    driver.end_step()
    assert aggregator.report()["trigger_rate"] == pytest.approx(aggregator.triggers / 3)


def test_named_adaptive_and_reactive() -> None:
    adaptive, reactive = named_method("inertia_adaptive"), named_method("inertia_reactive")
    assert type(adaptive.aggregator) is AdaptiveEMA and adaptive.aggregator.warmup == 10
    assert adaptive.aggregator.candidates == [0.0, 0.3, 0.5, 0.8, 0.95]
    assert type(reactive.aggregator) is ReactiveEMA
    assert (reactive.aggregator.low_alpha, reactive.aggregator.threshold) == (0.3, 0.5)


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("build", "named"),
    [
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), decode_eviction=False),
            "method.decode_eviction=false without method.prefill_attention=true never evicts — ",
        ),
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), prefill_window=1),
            "method.prefill_window=1 chooses prompt queries",
        ),
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), compress_every=0),
            "method.compress_every=0 must be an integer >= 1 — ",
        ),
        (
            lambda: ScoredEviction(AttentionScorer(), SingleStep(), Selection(rho=0.5), rescue_fraction=1.0),
            "method.rescue_fraction=1.0 must be a number in [0, 1) — ",
        ),
        (lambda: Selection(reserve_fraction=-0.1), "method.selection.reserve_fraction=-0.1 is outside [0, 1) — "),
        (
            lambda: ScoredEviction(AttentionScorer(), AdaptiveEMA(), Selection(rho=0.5, granularity="layer")),
            "method/aggregator=AdaptiveEMA adapts alpha from the state shared by all layers",
        ),
        (lambda: AdaptiveEMA(warmup=1), "method.aggregator.warmup=1 must be an integer >= 2 — "),
        (lambda: AdaptiveEMA(candidates=[]), "method.aggregator.candidates is empty — "),
        (lambda: AdaptiveEMA(candidates=[0.8, 1.0]), "method.aggregator.candidates entry=1.0 must be"),
        (lambda: ReactiveEMA(threshold=2), "method.aggregator.threshold=2 must be a number in [0, 1] — "),
        (lambda: ReactiveEMA(low_alpha="x"), "method.aggregator.low_alpha='x' must be a number in [0, 1) — "),
    ],
)
def test_bad_variant_options_name_the_option_and_the_fix(build, named: str) -> None:
    refused(build, named)


def test_rescue_that_leaves_no_room_for_the_protected_entries_is_refused() -> None:
    method = ScoredEviction(AttentionScorer(), EMA(), Selection(budget_tokens=4, window=3), rescue_fraction=0.5)
    refused(lambda: method.begin(seq(prefill_len=10, layers=1, kv_heads=1, group=1)), "method.rescue_fraction=0.5")
