"""FD-KVC: each channel's update rule on hand-computed values, and the method on real engines."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import refused
from transformers import AutoConfig, AutoModelForCausalLM

from harness.config import compose_config
from harness.decode.engine import Engine, Request
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


PAPER_READINGS = dict(
    relevance="minmax",
    normalise_over="cached",
    relevance_space="embeddings",
    recency_init="cosine",
    c_update="mean_query",
    rate="previous",
    recency_clip=False,
    prompt_attention=True,
)
EARLIER_READINGS = dict(
    relevance="relu",
    normalise_over="cached",
    relevance_space="keys",
    recency_init="one",
    c_update="attention",
    rate="current",
    recency_clip=True,
    prompt_attention=False,
)


def test_config_has_the_paper_defaults_and_the_dataclass_the_earlier_readings():
    from hydra.utils import instantiate

    method = instantiate(compose_config("method=fdkvc", "rho=0.5").method)
    assert isinstance(method, FDKVC)
    paper = dict(gamma=0.88, alpha0=0.3, mu=0.4, tau=0.02, beta=0.25, w_c=0.45, w_recency=0.55)
    assert {k: getattr(method, k) for k in paper} == paper
    assert {k: getattr(method, k) for k in PAPER_READINGS} == PAPER_READINGS
    assert {k: getattr(FDKVC(), k) for k in EARLIER_READINGS} == EARLIER_READINGS
    assert method.selection.rho == 0.5 and method.selection.granularity == "head"
    earlier = instantiate(compose_config("method=fdkvc", "rho=0.5", "method.recency_init=one").method)
    assert earlier.recency_init == "one"


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
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=8, beta=0.0, c_update="step")
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
    method = FDKVC(w_c=1.0, w_recency=0.0)
    # h = c / max c: [1, 0.5] and [1, 1]; the masked third entry counts nowhere.
    among = torch.tensor([[True, True, False], [True, True, False]])
    alpha, loss = method.adaptive_rate(torch.tensor([[2.0, 1.0, 9.0], [2.0, 2.0, 9.0]]), torch.zeros(2, 3), among)
    assert loss.tolist() == pytest.approx([0.125, 0.0])
    assert alpha.tolist() == pytest.approx([0.3 / 1.05, 0.3])
    alpha, loss = method.adaptive_rate(torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    assert alpha.item() == pytest.approx(0.3) and math.isnan(loss.item())
    assert FDKVC().hybrid(torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]))[0].tolist() == pytest.approx(
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


def test_minmax_relevance_over_the_masked_entries():
    method = FDKVC(relevance="minmax")
    cosine = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    among = torch.tensor([[True, True, True, False]])
    # Eq. 4 over the first three: (cos - min) / (max - min); the fourth lies within [0, 1] too.
    assert method.normalise(cosine, among)[0].tolist() == pytest.approx([1.0, 0.5, 0.0, 0.75], abs=1e-6)
    assert FDKVC(relevance="relu").normalise(cosine, among)[0].tolist() == [1.0, 0.0, 0.0, 0.5]
    assert FDKVC(relevance="affine").normalise(cosine, among)[0].tolist() == [1.0, 0.5, 0.0, 0.75]


def paper_turn(prompt_attention: bool = False) -> tuple[FDKVC, Driver]:
    """A three-entry prompt, then one two-token turn as a world step, under the paper's readings."""
    readings = {**PAPER_READINGS, "prompt_attention": prompt_attention}
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=2, beta=0.0, **readings)
    driver = Driver(method, info(3, new=2))
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.0, 0.0]]])
    embeddings = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [2.0, 0.0], [1.0, 1.0]]])
    prompt = LayerView(
        0, keys[:, :3], keys[:, :3], torch.arange(3)[None], queries=torch.tensor([[[0.0, 2.0], [0.0, 0.0]]]),
        embeddings=embeddings[:, :3],
    )  # fmt: skip
    driver.observe_prefill(prompt)
    assert driver.end_prefill() is None
    driver.next_step(2)
    assert driver.observing and not driver.attention  # Eq. 1 needs the mean query, not the weights
    turn = LayerView(
        0, keys, keys, torch.arange(5)[None], queries=torch.tensor([[[2.0, 0.0], [0.0, 0.0]]]), embeddings=embeddings
    )
    driver.observe(turn)
    assert driver.end_step() is None
    return method, driver


def test_algorithm_1_turn_end_under_the_paper_readings():
    method, _ = paper_turn()
    # Prompt: its own entries enter at c = 1 and recency = max(cos, 0) to its mean embedding [0, 1/3].
    # Turn: mean query [1, 0], softmax of its logits [1, 0, 0] over the cached entries 0..2 (Eq. 1).
    e = math.e
    c = [1 + e / (e + 2), 1 + 1 / (e + 2), 1 + 1 / (e + 2), 1.0, 1.0]
    assert method.c[0, 0, :5].tolist() == pytest.approx(c, abs=1e-6)
    # The turn's mean embedding points along [3, 1]: cosines [3, 1, -3] / sqrt 10 for the cached
    # entries, min-max normalised over them to [1, 2/3, 0] (Eq. 4) and added at rate alpha0 (the
    # previous turn end's rate; none yet) to the decayed recency [0, 1, 0] (Eqs. 2-3). The new
    # entries enter with their cosines (Algorithm 1, line 17): 3/sqrt 10 and 4/sqrt 20.
    recency = [0.3, 0.88 + 0.3 * 2 / 3, 0.0, 3 / math.sqrt(10), 4 / math.sqrt(20)]
    assert method.recency[0, 0, :5].tolist() == pytest.approx(recency, abs=1e-6)
    # The next turn's rate comes from h over the entries that were cached before this turn.
    h = 0.45 * torch.tensor(c[:3]) / max(c[:3]) + 0.55 * torch.tensor(recency[:3])
    h_hat = h / h.max()
    loss = (h_hat * (1 - h_hat)).mean()
    assert method.last_loss.item() == pytest.approx(loss.item(), abs=1e-6)
    assert method.last_alpha.item() == pytest.approx(0.3 / (1 + 0.4 * loss.item()), abs=1e-6)
    assert method.probes()["rate"].item() == pytest.approx(0.3 / (1 + 0.4 * loss.item()), abs=1e-6)


def test_the_prompt_attention_enters_c_before_the_first_eviction():
    method, _ = paper_turn(prompt_attention=True)
    # The prompt's mean query [0, 1]: softmax of its logits [0, 1, 0] over the prompt, added to
    # its entries' c when the prompt closes; the turn then adds its own softmax as above.
    e = math.e
    prompt = [1 / (e + 2), e / (e + 2), 1 / (e + 2)]
    turn = [e / (e + 2), 1 / (e + 2), 1 / (e + 2)]
    expected = [1 + a + b for a, b in zip(prompt, turn, strict=True)] + [1.0, 1.0]
    assert method.c[0, 0, :5].tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("prompt_attention", "kept"), [(True, [1, 4, 5]), (False, [4, 5, 6])])
def test_first_eviction_after_the_prompt_ranks_with_both_channels(prompt_attention: bool, kept: list[int]):
    # A six-entry prompt whose mean query attends to entry 1 above all; recency (the cosine of
    # the embeddings to their mean) is 1 for every entry, the new token's too.
    readings = {**PAPER_READINGS, "prompt_attention": prompt_attention}
    method = FDKVC(selection=Selection(budget_tokens=3), turn_length=4, beta=0.0, **readings)
    driver = Driver(method, info(6, new=4))
    keys = torch.zeros(1, 6, 2)
    keys[0, 1] = torch.tensor([8.0, 0.0])
    queries = torch.tensor([[[1.0, 0.0]]]).expand(1, 4, 2)
    embeddings = torch.ones(1, 6, 2)
    driver.observe_prefill(LayerView(0, keys, keys, torch.arange(6)[None], queries=queries, embeddings=embeddings))
    assert driver.end_prefill() is None
    driver.next_step()
    view = LayerView(
        0, torch.zeros(1, 7, 2), torch.zeros(1, 7, 2), driver.positions[0], queries=torch.ones(1, 1, 2),
        embeddings=torch.ones(1, 7, 2),
    )  # fmt: skip
    driver.observe(view)
    driver.end_step()
    # With the prompt's attention in c, entry 1 survives and the other prompt entries (c just
    # above 1) outrank the new token (c = 1); without it every h ties and the newest three stay.
    assert driver.positions[0].tolist() == [kept]


def test_equal_scores_keep_the_newer_entries():
    method = FDKVC(selection=Selection(budget_tokens=2), w_c=0.0, w_recency=1.0, turn_length=100)
    method.begin(info(4))
    method.recency[0, 0, :5] = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5])
    assert method.keep(1, [torch.arange(5)[None]])[0].tolist() == [3, 4]
    # Positions need not arrive in order: the newer position still wins.
    assert method.keep(1, [torch.tensor([[4, 0, 3, 1, 2]])])[0].tolist() == [0, 2]


def test_a_step_of_several_tokens_is_a_whole_turn():
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=32, beta=0.0, **PAPER_READINGS)
    driver = Driver(method, info(2, new=6))
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    driver.observe_prefill(LayerView(0, keys[:, :2], keys[:, :2], torch.arange(2)[None], queries=keys[:, :2]))
    driver.end_prefill()
    driver.next_step(3)
    driver.observe(LayerView(0, keys, keys, torch.arange(5)[None], queries=keys[:, 2:]))
    driver.end_step()
    # Three of six new tokens, a tenth of turn_length: the turn closed all the same.
    assert method.last_loss is not None and not math.isnan(method.last_loss.item())
    assert method.c[0, 0, :2].tolist() != [1.0, 1.0]


def test_an_answer_shorter_than_a_turn_still_closes_it():
    method = FDKVC(selection=Selection(budget_tokens=100), turn_length=32, beta=0.0, **PAPER_READINGS)
    driver = Driver(method, info(3, new=2))
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    driver.observe_prefill(LayerView(0, keys[:, :3], keys[:, :3], torch.arange(3)[None], queries=keys[:, :2]))
    driver.end_prefill()
    before = (method.c[0, 0, :3].clone(), method.recency[0, 0, :3].clone())
    for length in (4, 5):
        driver.next_step()
        view = LayerView(0, keys[:, :length], keys[:, :length], driver.positions[0], queries=keys[:, length - 1 :])
        driver.observe(view)
        driver.end_step()
        if length == 4:
            # Mid-turn the cached entries' channels wait for the turn end.
            assert torch.equal(method.c[0, 0, :3], before[0]) and torch.equal(method.recency[0, 0, :3], before[1])
    # The sequence's last step (2 of a 32-step turn) closes the turn: both channels moved.
    assert not torch.equal(method.c[0, 0, :3], before[0])
    assert not torch.equal(method.recency[0, 0, :3], before[1])
    assert method.c[0, 0, 3:5].tolist() == [1.0, 1.0]


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
    full = Engine(tiny_llama, FullCache()).generate(Request(PROMPT, 24)).tokens
    method = FDKVC(selection=Selection(rho=0.0, granularity=granularity), beta=0.0, turn_length=4)
    assert Engine(tiny_llama, method).generate(Request(PROMPT, 24)).tokens == full


@pytest.mark.parametrize("granularity", ["head", "layer", "token"])
def test_engine_bias_changes_attention_and_budget_holds(tiny_llama, granularity):
    def last_layer_values(beta: float) -> tuple[list[torch.Tensor], int]:
        seen: list[torch.Tensor] = []
        method = FDKVC(selection=Selection(rho=0.5, granularity=granularity), beta=beta, turn_length=4)
        engine = Engine(
            tiny_llama, method, on_step=lambda step, ctx, cache: seen.append(cache.layers[1].values.clone())
        )
        generation = engine.generate(Request(PROMPT, 24))
        assert generation.budget == 24 and generation.max_cache_len <= 24
        return seen, generation.cache_len_final

    plain, plain_len = last_layer_values(0.0)
    biased, biased_len = last_layer_values(1.0)
    assert plain_len == biased_len == 24
    # Step 0 (prefill) is unbiased; from the first decode step the bias changes the attention
    # output of layer 0, hence the values layer 1 caches for the new tokens.
    assert torch.equal(plain[0], biased[0])
    assert not torch.equal(plain[1][..., -1, :], biased[1][..., -1, :])


def test_engine_under_the_paper_readings(tiny_llama):
    full = Engine(tiny_llama, FullCache()).generate(Request(PROMPT, 12)).tokens
    # Tracking both channels without evicting or biasing leaves the model's output alone.
    roomy = FDKVC(selection=Selection(budget_tokens=1000), beta=0.0, turn_length=4, **PAPER_READINGS)
    assert Engine(tiny_llama, roomy).generate(Request(PROMPT, 12)).tokens == full
    # The prompt's attention entered c before the first eviction (tests above: exact values).
    assert not torch.all(roomy.c[:, :, : len(PROMPT)] == 1.0)
    method = FDKVC(selection=Selection(rho=0.5, granularity="head"), turn_length=4, **PAPER_READINGS)
    generation = Engine(tiny_llama, method).generate(Request(PROMPT, 12))
    assert generation.max_cache_len <= generation.budget == 24 and generation.cache_len_final == 24


def test_engine_bias_without_eviction_differs_from_full(tiny_llama):
    seen: dict[str, torch.Tensor] = {}

    def grab(name):
        return lambda step, ctx, cache: seen.__setitem__(name, cache.layers[1].values.clone())

    Engine(tiny_llama, FullCache(), on_step=grab("full")).generate(Request(PROMPT, 8))
    method = FDKVC(selection=Selection(rho=0.0), beta=0.5, turn_length=4)
    Engine(tiny_llama, method, on_step=grab("fdkvc")).generate(Request(PROMPT, 8))
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
    full = Engine(model, FullCache()).generate(Request(ids, 16)).tokens
    plain = FDKVC(selection=Selection(rho=0.0), beta=0.0, turn_length=8)
    assert Engine(model, plain).generate(Request(ids, 16)).tokens == full
    method = FDKVC(selection=Selection(rho=0.5, granularity="head"), beta=0.25, turn_length=8)
    biases: list[torch.Tensor] = []
    original = method.logit_bias

    def spy(layer: int, positions: torch.Tensor) -> torch.Tensor | None:
        bias = original(layer, positions)
        biases.append(bias)
        return bias

    method.logit_bias = spy
    generation = Engine(model, method).generate(Request(ids, 16))
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
        (
            {"relevance": "softmax"},
            "method.relevance='softmax' is not a relevance normalisation — use one of minmax, relu, affine, max",
        ),
        ({"c_update": "sum"}, "method.c_update='sum' is not a cumulative-channel update — use one of mean_query,"),
        ({"rate": "next"}, "method.rate='next' is not a rate timing — use one of previous, current"),
        ({"recency_clip": "yes"}, "method.recency_clip='yes' is not true or false — use method.recency_clip=true"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: FDKVC(**options), named)
