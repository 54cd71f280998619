"""FD-KVC: each channel's update rule on hand-computed values, and the method on real engines."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import refused
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config import compose_config
from harness.engine import Engine
from methods.base import KeepPlan, LayerView, SequenceInfo
from methods.driver import Driver
from methods.fdkvc import FDKVC
from methods.full import FullCache
from methods.selection import Selection


def info(prefill_len: int, heads: int = 1, new: int = 8) -> SequenceInfo:
    return SequenceInfo(
        prefill_len=prefill_len, num_layers=1, num_kv_heads=heads, num_query_heads=heads, max_new_tokens=new
    )


def view(weights: list[float], queries: torch.Tensor | None = None) -> LayerView:
    length = len(weights)
    return LayerView(
        0,
        keys=torch.randn(1, length, 2),
        values=torch.randn(1, length, 2),
        positions=torch.arange(length)[None],
        weights=torch.tensor(weights)[None, None],
        queries=torch.randn(1, 1, 2) if queries is None else queries,
    )


def step(driver: Driver, weights: list[float]) -> KeepPlan | None:
    """One decode step of a one-layer sequence that evicts nothing: ``weights`` over every cached entry."""
    driver.next_step()
    if driver.observing:
        driver.observe(view(weights))
    return driver.end_step()


def test_config_has_the_paper_defaults():
    from hydra.utils import instantiate

    method = instantiate(compose_config("method=fdkvc", "rho=0.5").method)
    assert isinstance(method, FDKVC)
    paper = dict(gamma=0.88, alpha0=0.3, mu=0.4, tau=0.02, beta=0.25, w_c=0.45, w_recency=0.55)
    assert {k: getattr(method, k) for k in paper} == paper
    assert method.selection.rho == 0.5 and method.selection.granularity == "head"
    with pytest.raises(ValueError):
        FDKVC(gamma=1.5)
    with pytest.raises(ValueError):
        FDKVC(relevance="softmax")


def test_cumulative_channel_new_entries_at_one_turn_mean_added_at_turn_end():
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=2, beta=0.0)
    driver = Driver(method, info(3))
    # No prefill observation: the prompt turn adds no relevance, so recency stays at 1.
    assert driver.end_prefill() is None
    step(driver, [0.1, 0.2, 0.3, 0.4])
    # Mid-turn: c untouched, every entry (the new one too) at 1.
    assert method.c[0, 0, :5].tolist() == [1.0] * 5
    step(driver, [0.1, 0.1, 0.2, 0.2, 0.4])
    # Turn end: c += (sum of the turn's attention) / 2 steps.
    assert method.c[0, 0, :5] == pytest.approx([1.1, 1.15, 1.25, 1.3, 1.2])
    # The rate comes from h before the recency update (recency = 1 everywhere).
    c_hat = torch.tensor([1.1, 1.15, 1.25, 1.3, 1.2]) / 1.3
    h = 0.45 * c_hat + 0.55
    h_hat = h / h.max()
    alpha = 0.3 / (1 + 0.4 * (h_hat * (1 - h_hat)).mean())
    assert method.last_alpha.item() == pytest.approx(alpha.item())


def test_cumulative_channel_every_step_is_h2o_with_new_entries_at_one():
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=8, beta=0.0, c_every_step=True)
    driver = Driver(method, info(3))
    driver.end_prefill()
    step(driver, [0.1, 0.2, 0.3, 0.4])
    assert method.c[0, 0, :5].tolist() == pytest.approx([1.1, 1.2, 1.3, 1.4, 1.0])


def test_recency_decays_and_is_reinforced_by_the_cosine_to_the_mean_query():
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=4)
    method.begin(info(4))
    method.c[0, 0, :4] = torch.tensor([1.0, 2.0, 4.0, 1.0])
    method.recency[0, 0, :4] = torch.tensor([0.5, 0.5, 0.5, 0.2])
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]]])
    # Mean query [1, 0] (two prompt queries): cosines [1, 0, -1, 1/sqrt 2] -> relu.
    queries = torch.tensor([[[2.0, 1.0], [0.0, -1.0]]])
    assert method.wants_prefill_queries == 4
    method.observe_prefill(LayerView(0, keys, keys, torch.arange(4)[None], queries=queries))
    assert method.keep(0, [torch.arange(4)[None]]) is None
    # h = 0.45 * c / 4 + 0.55 * recency = [0.3875, 0.5, 0.725, 0.2225]; h_hat = h / 0.725;
    # L = mean h_hat (1 - h_hat) = 0.168888; alpha = 0.3 / (1 + 0.4 L) = 0.281018.
    assert method.last_loss.item() == pytest.approx(0.168888, abs=1e-5)
    assert method.last_alpha.item() == pytest.approx(0.281018, abs=1e-5)
    alpha = 0.281018
    expected = [0.88 * 0.5 + alpha, 0.44, 0.44, 0.88 * 0.2 + alpha / math.sqrt(2)]
    assert method.recency[0, 0, :4].tolist() == pytest.approx(expected, abs=1e-5)


def test_adaptive_rate_from_the_ownership_loss():
    method = FDKVC()
    alpha, loss = method.rate(torch.tensor([[1.0, 0.5], [2.0, 2.0]]))
    assert loss.tolist() == pytest.approx([0.125, 0.0])
    assert alpha.tolist() == pytest.approx([0.3 / 1.05, 0.3])
    assert method.hybrid(torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]))[0].tolist() == pytest.approx(
        [0.45, 0.225 + 0.55]
    )


def test_threshold_then_top_budget():
    method = FDKVC(selection=Selection(budget_tokens=3), w_c=0.0, w_recency=1.0, tau=0.5, turn_length=100)
    method.begin(info(4))
    method.recency[0, 0, :5] = torch.tensor([0.9, 0.1, 0.6, 0.3, 0.8])
    positions = [torch.arange(5)[None]]
    assert method.keep(1, positions)[0].tolist() == [0, 2, 4]
    method.tau = 0.7  # 0.6 < 0.7 * 0.9 falls under the threshold: fewer than B survive
    assert method.keep(1, positions)[0].tolist() == [0, 4]
    method.tau = 0.0
    method.recency[0, 0, :4] = torch.tensor([0.9, 0.1, 0.6, 0.3])
    assert method.keep(1, [torch.arange(4)[None]])[0].tolist() == [0, 2, 3]


def test_threshold_per_head_keeps_one_size_for_all_heads():
    selection = Selection(budget_tokens=3, granularity="head")
    method = FDKVC(selection=selection, w_c=0.0, w_recency=1.0, tau=0.7, turn_length=100)
    method.begin(info(4, heads=2))
    method.recency[0, :, :5] = torch.tensor([[0.9, 0.1, 0.6, 0.3, 0.8], [0.9, 0.85, 0.8, 0.75, 0.7]])
    plan = method.keep(1, [torch.arange(5).expand(2, -1)])
    assert plan[0].tolist() == [[0, 2, 4], [0, 1, 2]]


def test_attention_modulation_bias():
    method = FDKVC(selection=Selection(budget_tokens=10), beta=0.25)
    method.begin(info(3))
    positions = torch.arange(3)[None]
    method.recency[0, 0, :3] = torch.tensor([1.0, 0.5, 0.0])
    expected = [0.0, 0.25 * math.log(0.75), 0.25 * math.log(0.5)]
    assert method.logit_bias(0, positions)[0].tolist() == pytest.approx(expected)
    method.recency[0, 0, :3] = torch.tensor([0.5, 0.25, 0.0])  # recency_hat = recency / max recency
    assert method.logit_bias(0, positions)[0].tolist() == pytest.approx(expected)
    # Multiplying the softmax weights by (0.5 + 0.5 recency_hat)^beta is this additive logit bias.
    logits = torch.tensor([0.3, -0.2, 0.5])
    modulated = torch.softmax(logits, 0) * (0.5 + 0.5 * torch.tensor([1.0, 0.5, 0.0])) ** 0.25
    biased = torch.softmax(logits + method.logit_bias(0, positions)[0], 0)
    assert torch.allclose(biased, modulated / modulated.sum())
    method.beta = 0.0
    assert method.logit_bias(0, positions) is None


def test_no_budget_and_no_bias_does_nothing():
    method = FDKVC(selection=Selection(rho=0.0), beta=0.0)
    method.begin(info(5))
    assert not method.observes(1) and not method.needs_attention(1) and method.wants_prefill_queries == 0
    assert method.budget() is None and method.keep(1, [torch.arange(6)[None]]) is None
    assert method.logit_bias(0, torch.arange(6)[None]) is None


# ---------------------------------------------------------------------- real engine
@pytest.fixture(scope="module")
def tiny_llama():
    config = AutoConfig.for_model(
        "llama",
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


PROMPT = [int(i) for i in torch.randint(0, 1000, (48,), generator=torch.Generator().manual_seed(1))]


@pytest.mark.parametrize("granularity", ["head", "layer", "token"])
def test_engine_no_eviction_no_bias_equals_full(tiny_llama, granularity):
    full = Engine(tiny_llama, FullCache()).generate(PROMPT, 24).tokens
    method = FDKVC(selection=Selection(rho=0.0, granularity=granularity), beta=0.0, turn_length=4)
    assert Engine(tiny_llama, method).generate(PROMPT, 24).tokens == full


@pytest.mark.parametrize("granularity", ["head", "layer", "token"])
def test_engine_bias_changes_attention_and_budget_holds(tiny_llama, granularity):
    def last_layer_values(beta: float) -> tuple[list[torch.Tensor], int]:
        seen: list[torch.Tensor] = []
        method = FDKVC(selection=Selection(rho=0.5, granularity=granularity), beta=beta, turn_length=4)
        engine = Engine(
            tiny_llama, method, on_step=lambda step, ctx, cache: seen.append(cache.layers[1].values.clone())
        )
        generation = engine.generate(PROMPT, 24)
        assert generation.budget == 24 and generation.max_cache_len <= 24
        return seen, generation.cache_len_final

    plain, plain_len = last_layer_values(0.0)
    biased, biased_len = last_layer_values(1.0)
    assert plain_len == biased_len == 24
    # Step 0 (prefill) is unbiased; from the first decode step the bias changes the attention
    # output of layer 0, hence the values layer 1 caches for the new tokens.
    assert torch.equal(plain[0], biased[0])
    assert not torch.equal(plain[1][..., -1, :], biased[1][..., -1, :])


def test_engine_bias_without_eviction_differs_from_full(tiny_llama):
    seen: dict[str, torch.Tensor] = {}

    def grab(name):
        return lambda step, ctx, cache: seen.__setitem__(name, cache.layers[1].values.clone())

    Engine(tiny_llama, FullCache(), on_step=grab("full")).generate(PROMPT, 8)
    method = FDKVC(selection=Selection(rho=0.0), beta=0.5, turn_length=4)
    Engine(tiny_llama, method, on_step=grab("fdkvc")).generate(PROMPT, 8)
    assert seen["full"].shape == seen["fdkvc"].shape
    assert not torch.allclose(seen["full"], seen["fdkvc"])


def test_smollm2_multi_turn_chat(smollm2):
    """FD-KVC on the real model over a multi-turn chat: exact without bias or eviction, budget held with."""
    model, tokenizer = smollm2
    messages = [
        {"role": "user", "content": "Name three fruits that are red."},
        {"role": "assistant", "content": "Strawberries, cherries and raspberries."},
        {"role": "user", "content": "Now name three vegetables that are green, and one that is orange."},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    full = Engine(model, FullCache()).generate(ids, 16).tokens
    plain = FDKVC(selection=Selection(rho=0.0), beta=0.0, turn_length=8)
    assert Engine(model, plain).generate(ids, 16).tokens == full
    method = FDKVC(selection=Selection(rho=0.5, granularity="head"), beta=0.25, turn_length=8)
    biases: list[torch.Tensor] = []
    original = method.logit_bias

    def spy(layer: int, positions: torch.Tensor) -> torch.Tensor | None:
        bias = original(layer, positions)
        biases.append(bias)
        return bias

    method.logit_bias = spy
    generation = Engine(model, method).generate(ids, 16)
    assert generation.max_cache_len <= generation.budget == len(ids) // 2
    assert biases and all(b is not None for b in biases)
    assert any(float(b.min()) < 0 for b in biases)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"gamma": "abc"}, "method.gamma='abc' must be a number in [0, 1] — use e.g. method.gamma=0.88"),
        ({"gamma": 1.5}, "method.gamma=1.5 must be a number in [0, 1] — "),
        ({"alpha0": -0.1}, "method.alpha0=-0.1 must be a number >= 0 — use e.g. method.alpha0=0.3"),
        ({"mu": "x"}, "method.mu='x' must be a number >= 0 — "),
        ({"beta": None}, "method.beta=None must be a number >= 0 — "),
        ({"tau": 1.0}, "method.tau=1.0 must be a number in [0, 1) — "),
        ({"w_c": "half"}, "method.w_c='half' must be a number >= 0 — "),
        (
            {"w_c": 0, "w_recency": 0.0},
            "method.w_c=0 and method.w_recency=0.0 are both 0, so no entry ranks above another — ",
        ),
        ({"turn_length": 0}, "method.turn_length=0 must be an integer >= 1 — use e.g. method.turn_length=32"),
        ({"turn_length": "32"}, "method.turn_length='32' must be an integer >= 1 — "),
        ({"relevance": "softmax"}, "method.relevance='softmax' is not a relevance normalisation — use one of relu,"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: FDKVC(**options), named)
