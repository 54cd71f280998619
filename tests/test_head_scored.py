"""Per-head scored eviction (KeyDiff on its own, AdaKV + Expected Attention): hand-made scores through the driver,
then the real methods on a tiny model (ragged storage, layer-wise prefill eviction, decode schedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import named_method, refused
from torch import Tensor

from harness.decode import kv_cache
from harness.decode.engine import Engine, Request
from harness.errors import UserError, user_errors
from methods.base import LayerView, SequenceInfo
from methods.driver import Driver
from methods.full import FullCache
from methods.head_scored import HeadScoredEviction
from methods.scorers.base import Scorer
from methods.scorers.keydiff import KeyDiffScorer
from methods.selection import Selection

L0 = 8


@dataclass
class GivenScores(Scorer):
    """Scores fixed by the test: ``table[layer]`` over absolute positions, per KV head."""

    table: dict[int, Tensor]
    needs_attention: ClassVar[bool] = False
    order_free: ClassVar[bool] = True  # looked up by absolute position
    scores_ragged: ClassVar[bool] = True

    def score(self, view: LayerView) -> Tensor | tuple[Tensor, ...]:
        if isinstance(view.positions, tuple):
            return tuple(
                row.index_select(0, kept) for row, kept in zip(self.table[view.layer], view.positions, strict=True)
            )
        return self.table[view.layer].gather(1, view.positions)


def method(table: dict[int, Tensor], budget: int, allocation: str, **options) -> HeadScoredEviction:
    selection = Selection(budget_tokens=budget, sinks=options.pop("sinks", 0), granularity="head")
    return HeadScoredEviction(GivenScores(table), selection, allocation=allocation, **options)


def prefill(driver: Driver, layer: int, kv_heads: int = 2) -> object:
    keys = torch.zeros(kv_heads, L0, 2)
    view = LayerView(layer, keys, keys, driver.positions[layer], queries=torch.zeros(kv_heads, L0, 2))
    return driver.observe_prefill(view)


def lists(keep) -> list[list[int]]:
    return [row.tolist() for row in keep]


TABLE = {
    0: torch.tensor(
        [
            [0.9, 0.01, 0.03, 0.011, 0.02, 0.012, 0.025, 0.013],  # concentrated
            [0.2, 0.15, 0.1, 0.14, 0.11, 0.12, 0.13, 0.05],  # spread
        ]
    )
}


def test_uniform_allocation_keeps_the_best_b_per_head_inside_the_prefill():
    driver = Driver(method(TABLE, budget=3, allocation="uniform"), SequenceInfo(L0, 1, 2, 2, 4))
    keep = prefill(driver, 0)
    assert keep.tolist() == [[0, 2, 6], [0, 1, 3]]
    assert driver.positions[0].shape == (2, 3)
    assert driver.end_prefill() is None


def test_adaptive_allocation_moves_slots_to_the_spread_head_and_keeps_the_floor():
    # 2 heads x B=3 = 6 slots; safeguard 1/3 of B: each head keeps its own best first.
    driver = Driver(method(TABLE, budget=3, allocation="adaptive", safeguard=1 / 3), SequenceInfo(L0, 1, 2, 2, 4))
    keep = prefill(driver, 0)
    # Pooled: 0.9 and 0.2 (floors), then 0.15, 0.14, 0.13, 0.12, all the spread head's.
    assert lists(keep) == [[0], [0, 1, 3, 5, 6]]
    assert [row.tolist() for row in driver.positions[0]] == [[0], [0, 1, 3, 5, 6]]


def test_decode_schedule_cuts_back_to_the_budget_every_step():
    table = {0: torch.tensor([[5.0, 4, 3, 2, 1, 0, 0, 0, 9], [0.0, 0, 0, 1, 2, 3.5, 4, 5, 0.5]])}
    evicting = method(table, budget=3, allocation="adaptive", safeguard=0.0, schedule="decode")
    driver = Driver(evicting, SequenceInfo(L0, 1, 2, 2, 4))
    prefill(driver, 0)
    # 6 slots: 5, 5, 4, 4, 3.5, 3 fall 3 and 3, so the layer is plain again.
    assert driver.positions[0].tolist() == [[0, 1, 2], [5, 6, 7]]
    driver.next_step()
    assert driver.observing
    positions = driver.positions[0]
    keys = torch.zeros(2, positions.shape[1], 2)
    view = LayerView(0, keys, keys, positions, queries=torch.zeros(2, 1, 2))
    driver.observe(view)
    plan = driver.end_step()
    # The new token (position 8) scores 9 on head 0 and 0.5 on head 1: head 0's 3 gives way to it.
    assert [row.tolist() for row in plan[0]] == [[0, 1, 3], [0, 1, 2]]
    assert driver.positions[0].tolist() == [[0, 1, 8], [5, 6, 7]]


def test_prefill_schedule_lets_the_cache_grow():
    driver = Driver(method(TABLE, budget=3, allocation="uniform"), SequenceInfo(L0, 1, 2, 2, 4))
    prefill(driver, 0)
    driver.next_step()
    assert not driver.observing
    assert driver.end_step() is None
    assert driver.positions[0].shape == (2, 4)


def test_keydiff_keeps_the_keys_least_like_the_mean_direction():
    # One head: the mean of the unit keys points at 45 degrees; the keys' cosines to it are known.
    angles = [0.0, 0.1, 0.2, math.pi / 2, math.pi, 1.0, 0.05, 0.15]
    keys = torch.tensor([[math.cos(a), math.sin(a)] for a in angles])
    evicting = HeadScoredEviction(KeyDiffScorer(), Selection(budget_tokens=3, granularity="head"))
    driver = Driver(evicting, SequenceInfo(L0, 1, 1, 1, 4))
    view = LayerView(0, keys[None], keys[None], driver.positions[0], queries=torch.zeros(1, L0, 2))
    keep = driver.observe_prefill(view)
    anchor = keys.mean(dim=0)
    cosine = keys @ anchor / anchor.norm()
    assert keep[0].tolist() == sorted(cosine.argsort()[:3].tolist())
    assert keep[0].tolist() == [3, 4, 5]


def configured(name: str, *overrides: str) -> HeadScoredEviction:
    with user_errors():
        return named_method(name, *overrides)


def test_mistakes_are_refused_in_one_line():
    refused(lambda: configured("adakv_ea", "method.selection.granularity=token"), "granularity='token'", UserError)
    refused(lambda: configured("keydiff", "method.schedule=always"), "method.schedule='always'", UserError)
    refused(lambda: configured("adakv_ea", "method.allocation=greedy"), "method.allocation='greedy'", UserError)
    refused(lambda: configured("adakv_ea", "method.safeguard=1.5"), "method.safeguard=1.5", UserError)
    message = refused(
        lambda: configured("keydiff", "method.allocation=adaptive", "method.schedule=decode"),
        "KeyDiffScorer",
        UserError,
    )
    assert "method.schedule=prefill" in message
    refused(lambda: configured("adakv_ea", "method.scorer.future=0"), "method.scorer.future=0", UserError)


# ------------------------------------------------------------------------------------------ on a model
PROMPT_LEN = 96


def prompt(seed: int) -> list[int]:
    return torch.randint(0, 49152, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()


def steps(engine: Engine) -> list[dict]:
    seen = []

    def hook(step, context, cache):
        seen.append(
            {
                "step": step,
                "lengths": kv_cache.head_lengths(cache),
                "positions": list(context.positions),
                "heads": [kv_cache.layer_heads(cache, layer) for layer in range(len(cache.layers))],
            }
        )

    engine.on_step = hook
    return seen


@pytest.mark.parametrize("model_name", ["tiny_qwen2", "tiny_llama"])
def test_adakv_ea_stores_ragged_heads_physically(tiny_models, model_name):
    model = tiny_models[model_name]
    ids = prompt(1)
    full = Engine(model, FullCache())
    full_steps = steps(full)
    full.generate(Request(ids, 4))
    engine = Engine(model, named_method("adakv_ea", "rho=0.75"))
    trace = steps(engine)
    result = engine.generate(Request(ids, 4))
    budget = PROMPT_LEN // 4
    heads = model.config.num_key_value_heads
    floor = math.floor(0.2 * budget)
    after_prefill = trace[0]["lengths"]
    assert any(len(set(lengths)) > 1 for lengths in after_prefill), "AdaKV should give heads different counts"
    for lengths in after_prefill:
        assert sum(lengths) == heads * budget and min(lengths) >= max(floor, 4)
    for layer, positions in enumerate(trace[-1]["positions"]):
        keys, _ = trace[-1]["heads"][layer]
        full_keys, _ = full_steps[-1]["heads"][layer]
        rows = positions if isinstance(positions, tuple) else positions.unbind(0)
        for head, row in enumerate(rows):
            assert row[:4].tolist() == [0, 1, 2, 3], "the four sinks stay"
            assert row[-3:].tolist() == [PROMPT_LEN, PROMPT_LEN + 1, PROMPT_LEN + 2], "new tokens join every head"
            # Prompt entries are computed in the prefill, before any eviction: the full cache's, at every layer.
            prompt_entries = row < PROMPT_LEN
            torch.testing.assert_close(keys[head][prompt_entries], full_keys[head][row[prompt_entries]])
    entry = 2 * model.config.head_dim * 4  # keys and values, float32
    layers = model.config.num_hidden_layers
    assert result.kv_bytes_final == layers * (heads * budget + heads * 3) * entry
    assert result.kv_entries_final == result.kv_entries_held == budget + 3
    # The longest head holds more than the mean: "retained tokens" reads the mean, held in memory.
    assert result.cache_len_final == max(max(lengths) for lengths in trace[-1]["lengths"]) > budget + 3


def test_layer_wise_prefill_eviction_lowers_the_prefill_peak(tiny_models):
    model = tiny_models["tiny_llama"]
    ids = prompt(2)
    layers, heads, dim = model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim
    entry = 2 * dim * 4
    budget = PROMPT_LEN // 4
    full_prompt = layers * heads * PROMPT_LEN * entry
    decode_time = Engine(model, named_method("inertia", "rho=0.75")).generate(Request(ids, 4))
    assert decode_time.prefill_peak_bytes == full_prompt
    for name in ("adakv_ea", "keydiff"):
        pressed = Engine(model, named_method(name, "rho=0.75")).generate(Request(ids, 4))
        # The peak is at the last layer: the others already cut to H * B, the last one whole.
        assert pressed.prefill_peak_bytes == (layers - 1) * heads * budget * entry + heads * PROMPT_LEN * entry, name
        assert pressed.decode_peak_bytes == layers * heads * (budget + 3) * entry, name


def test_decode_schedule_holds_the_budget_at_every_step(tiny_models):
    model = tiny_models["tiny_qwen2"]
    for name in ("adakv_ea", "keydiff"):
        engine = Engine(model, named_method(name, "rho=0.75", "method.schedule=decode"))
        trace = steps(engine)
        result = engine.generate(Request(prompt(3), 6))
        heads = model.config.num_key_value_heads
        for snapshot in trace:
            for lengths in snapshot["lengths"]:
                assert sum(lengths) == heads * PROMPT_LEN // 4, (name, snapshot["step"])
        assert result.kv_entries_final == PROMPT_LEN // 4


class MaskedPrompt(FullCache):
    """The full cache with every prompt entry outside ``kept[layer][head]`` hidden from attention (-inf bias)."""

    def __init__(self, kept: list[list[Tensor]]) -> None:
        self.kept = kept

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor:
        kept = [torch.isin(row, self.kept[layer][head]) for head, row in enumerate(positions.unbind(0))]
        visible = torch.stack(kept) | (positions >= self.info.prefill_len)
        return torch.zeros(positions.shape).masked_fill(~visible, -torch.inf)


@pytest.mark.parametrize("name", ["adakv_ea", "keydiff"])
def test_a_layer_cut_inside_the_prefill_decodes_as_the_full_cache_with_its_evicted_entries_masked(tiny_models, name):
    model = tiny_models["tiny_qwen2"]
    ids, forced = prompt(4), prompt(5)[:8]
    engine = Engine(model, named_method(name, "rho=0.75"))
    trace = steps(engine)
    evicted = engine.generate(Request(ids, 1, forced=forced))
    kept = [list(p) if isinstance(p, tuple) else list(p.unbind(0)) for p in trace[0]["positions"]]
    masked = Engine(model, MaskedPrompt(kept)).generate(Request(ids, 1, forced=forced))
    torch.testing.assert_close(torch.tensor(evicted.target_logprobs), torch.tensor(masked.target_logprobs))
    assert masked.kv_bytes_final > evicted.kv_bytes_final
