"""The engine invariants, on tiny random Llama / Qwen2 / Qwen3 / Mistral models."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import NAMED_METHODS, TINY_MODELS, named_method

from harness.decode import attention, kv_cache
from harness.decode.counting import counting
from harness.decode.engine import Engine, Request
from harness.decode.evicting_attention import query_attention, ragged_single_query_attention, single_query_attention
from harness.decode.sampling import Sampling
from methods.full import FullCache
from methods.scorers.bilinear import BilinearHead, BilinearInfo, save_bilinear

PROMPT_LEN = 96
NEW_TOKENS = 24


def prompt(seed: int, length: int = PROMPT_LEN) -> list[int]:
    return torch.randint(0, 49152, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference(model, ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    model.set_attn_implementation("sdpa")
    out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("model_name", TINY_MODELS)
def test_no_eviction_matches_generate_for_every_method(tiny_models, model_name):
    model = tiny_models[model_name]
    ids = prompt(1)
    expected = reference(model, ids)
    for name in NAMED_METHODS:
        variants = [["rho=0"]] if name == "full" else [["rho=0"], ["rho=0.5", "method.selection.budget_tokens=100000"]]
        for overrides in variants:
            method = named_method(name, *overrides)
            tokens = Engine(model, method).generate(Request(ids, NEW_TOKENS)).tokens
            assert tokens == expected, f"{name} {overrides} diverged from model.generate"


def record_steps(engine: Engine):
    seen = []

    def hook(step, context, cache):
        seen.append(
            {
                "step": step,
                "lengths": kv_cache.cache_lengths(cache),
                "positions": [p.clone() for p in context.positions],
                "layers": [(k.clone(), v.clone()) for k, v in kv_cache.layer_tensors(cache)],
                "storage": [k.untyped_storage().nbytes() for k, _ in kv_cache.layer_tensors(cache)],
            }
        )

    engine.on_step = hook
    return seen


@pytest.mark.parametrize("name", ["inertia", "inertia_lazy", "score_free", "tova_decode", "h2o", "streaming_llm"])
def test_budget_held_physically_after_every_decode_step(tiny_models, name):
    model = tiny_models["tiny_llama"]
    engine = Engine(model, named_method(name, "rho=0.5"))
    steps = record_steps(engine)
    result = engine.generate(Request(prompt(2), NEW_TOKENS))
    budget = PROMPT_LEN // 2
    assert result.budget == budget
    decode = [s for s in steps if s["step"] >= 1]
    assert len(decode) == NEW_TOKENS - 1
    for s in decode:
        assert s["lengths"] == [budget] * len(s["lengths"]), s["step"]
        keys, values = s["layers"][0]
        assert keys.shape[-2] == values.shape[-2] == budget
    # No storage of the uncompressed cache stays alive: the buffers hold B slots and the one the
    # next token is written into.
    bytes_per_layer = 2 * budget * keys.shape[1] * keys.shape[-1] * keys.element_size()
    slot_bytes = bytes_per_layer // (2 * budget)
    assert steps[-1]["storage"] == [(budget + 1) * slot_bytes] * len(steps[-1]["storage"])
    assert result.kv_bytes_final == bytes_per_layer * model.config.num_hidden_layers
    assert result.slot_bytes_final == 2 * (budget + 1) * slot_bytes * model.config.num_hidden_layers
    full_len = PROMPT_LEN + NEW_TOKENS - 1
    assert result.kv_bytes_final / result.kv_bytes_full == pytest.approx(budget / full_len)
    assert result.cache_len_final == budget


@pytest.mark.parametrize("model_name", TINY_MODELS)
def test_new_tokens_keep_absolute_positions(tiny_models, model_name):
    """Layer-0 keys depend only on the token and its RoPE position: under eviction they must
    equal the full-cache keys of the same token at the same absolute position."""
    model = tiny_models[model_name]
    ids = prompt(3)
    full = Engine(model, FullCache())
    full_steps = record_steps(full)
    full_tokens = full.generate(Request(ids, 6)).tokens
    evicting = Engine(model, named_method("streaming_llm", "rho=0.75"))
    evict_steps = record_steps(evicting)
    evict_tokens = evicting.generate(Request(ids, 6)).tokens
    # Step-1 logits come from the full prompt, so the first two tokens always agree.
    assert evict_tokens[:2] == full_tokens[:2]
    step2 = evict_steps[2]
    newest = PROMPT_LEN + 1
    layer0_positions = step2["positions"][0]
    assert int(layer0_positions.max()) == newest
    assert step2["lengths"][0] == PROMPT_LEN // 4
    slot = int((layer0_positions[0] == newest).nonzero())
    evicted_key = step2["layers"][0][0][0, :, slot]
    full_key = full_steps[2]["layers"][0][0][0, :, newest]
    torch.testing.assert_close(evicted_key, full_key, rtol=1e-5, atol=1e-6)


def test_per_head_keep_sets_are_gathered_physically(tiny_models):
    model = tiny_models["tiny_qwen2"]
    ids = prompt(4)
    full = Engine(model, FullCache())
    full_steps = record_steps(full)
    full.generate(Request(ids, 2))
    # Decode-time attention only: with the prompt's own votes every head of a tiny random
    # model keeps the earliest entries, which would not show per-head sets apart.
    per_head = Engine(model, named_method("h2o", "rho=0.5", "method.prefill_attention=false"))
    per_head_steps = record_steps(per_head)
    per_head.generate(Request(ids, 2))
    after = per_head_steps[1]
    keys = after["layers"][0][0]
    positions = after["positions"][0]
    assert keys.shape == (1, 2, PROMPT_LEN // 2, 16)
    assert not torch.equal(positions[0], positions[1]), "KV heads should keep different entries"
    full_keys = full_steps[1]["layers"][0][0]
    for head in range(2):
        torch.testing.assert_close(keys[0, head], full_keys[0, head, positions[head]])


def test_scores_come_from_the_attention_already_computed(tiny_models, monkeypatch):
    model = tiny_models["tiny_llama"]
    layers = model.config.num_hidden_layers
    sdpa_calls = []
    original = attention.sdpa_attention_forward

    def counting(module, query, *args, **kwargs):
        sdpa_calls.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_attention_forward", counting)
    for name, observed_steps in (("inertia", NEW_TOKENS - 1), ("inertia_lazy", 6)):
        sdpa_calls.clear()
        engine = Engine(model, named_method(name, "rho=0.5"))
        contexts = []
        engine.on_step = lambda step, context, cache, contexts=contexts: contexts.append(context)
        engine.generate(Request(prompt(5), NEW_TOKENS))
        context = contexts[-1]
        # One explicit attention per layer per observed step, nothing else at those steps.
        assert context.attention_calls == {layer: observed_steps for layer in range(layers)}
        decode_sdpa = [q for q in sdpa_calls if q == 1]
        assert len(decode_sdpa) == layers * (NEW_TOKENS - 1 - observed_steps)


def test_single_query_attention_matches_sdpa():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, 1, 16, generator=generator)
    key = torch.randn(1, 2, 40, 16, generator=generator)
    value = torch.randn(1, 2, 40, 16, generator=generator)
    output, weights = single_query_attention(query, key, value, 0.25, None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), scale=0.25
    )
    torch.testing.assert_close(output, expected.transpose(1, 2))
    assert weights.shape == (2, 3, 40)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    bias = torch.zeros(2, 40)
    bias[:, 7] = -torch.inf
    _, masked = single_query_attention(query, key, value, 0.25, bias)
    assert torch.all(masked[:, :, 7] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_attention_folds_scale_and_bias_into_one_product_and_gives_the_same_attention(dtype):
    # numerics 4: one baddbmm where the reference takes a product, a scale and a bias add.
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(3, 6, 1, 16, generator=generator).to(dtype)
    key = torch.randn(3, 2, 40, 16, generator=generator).to(dtype)
    value = torch.randn(3, 2, 40, 16, generator=generator).to(dtype)
    bias = torch.zeros(3, 2, 40).masked_fill(torch.rand(3, 2, 40, generator=generator) < 0.3, -torch.inf)
    for row_bias in (None, bias):
        expected = query_attention(query, key, value, 0.25, row_bias)
        with torch.inference_mode(), counting() as counts:  # as the engine decodes: matmul is one operation
            fused = query_attention(query, key, value, 0.25, row_bias, fused=True)
        assert counts.kernels["baddbmm"] == 1 and counts.kernels["matmul"] == 1
        assert "mul" not in counts.kernels and "add" not in counts.kernels
        torch.testing.assert_close(fused[1], expected[1], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(fused[0], expected[0])
    assert torch.all(fused[1][bias[:, :, None, :].expand_as(fused[1]) == -torch.inf] == 0)


def test_every_sequence_starts_fresh_and_evicts_every_step(tiny_models):
    model = tiny_models["tiny_mistral"]
    engine = Engine(model, named_method("inertia", "rho=0.5"))
    alone = engine.generate(Request(prompt(7), NEW_TOKENS)).tokens
    steps = record_steps(engine)
    engine.generate(Request(prompt(6, length=80), NEW_TOKENS))
    first = list(steps)
    steps.clear()
    again = engine.generate(Request(prompt(7), NEW_TOKENS)).tokens
    assert again == alone
    for trace, budget in ((first, 40), (steps, PROMPT_LEN // 2)):
        lengths_before = [s["lengths"][0] for s in trace]
        assert lengths_before[0] == budget * 2, "the prefill keeps the whole prompt"
        assert all(length == budget for length in lengths_before[1:]), "eviction at every decode step"


def test_sampling_is_reproducible_under_a_seed(tiny_models):
    model = tiny_models["tiny_llama"]
    engine = Engine(model, named_method("inertia", "rho=0.5"), Sampling(temperature=1.0, top_p=0.9, top_k=50))
    a = engine.generate(Request(prompt(8), NEW_TOKENS, seed=11)).tokens
    b = engine.generate(Request(prompt(8), NEW_TOKENS, seed=11)).tokens
    c = engine.generate(Request(prompt(8), NEW_TOKENS, seed=12)).tokens
    assert a == b
    assert a != c


def test_sampling_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    generator = torch.Generator().manual_seed(0)
    assert {Sampling(temperature=1.0, top_k=1).choose(logits, generator) for _ in range(20)} == {0}
    # top_p=0.6: token 0 holds 0.64 of the mass, so it alone survives.
    assert {Sampling(temperature=1.0, top_p=0.6).choose(logits, generator) for _ in range(20)} == {0}
    # Mass 0.64, 0.24, 0.09, 0.03: the smallest set reaching 0.85 is {0, 1}; reaching 0.9 adds 2.
    assert {Sampling(temperature=1.0, top_p=0.85).choose(logits, generator) for _ in range(300)} == {0, 1}
    assert {Sampling(temperature=1.0, top_p=0.9).choose(logits, generator) for _ in range(300)} == {0, 1, 2}
    assert Sampling().choose(logits, None) == 0
    with pytest.raises(ValueError, match="top_p=1.5"):
        Sampling(top_p=1.5)


def test_stop_tokens_end_generation(tiny_models):
    model = tiny_models["tiny_llama"]
    ids = prompt(9)
    tokens = Engine(model, FullCache()).generate(Request(ids, NEW_TOKENS)).tokens
    stopped = Engine(model, FullCache()).generate(Request(ids, NEW_TOKENS, stop_token_ids={tokens[3]})).tokens
    assert stopped == tokens[: tokens.index(tokens[3]) + 1]


def test_budget_below_protected_entries_is_refused(tiny_models):
    engine = Engine(tiny_models["tiny_llama"], named_method("snapkv", "rho=0.9"))
    message = r"budget B=9 \(rho=0.9 of L0=96 prompt tokens\) is smaller than sinks\+window=0\+32=32 — lower rho"
    with pytest.raises(ValueError, match=message):
        engine.check(PROMPT_LEN, 8)


def test_teacher_forcing_scores_the_given_tokens_under_eviction(tiny_models):
    model = tiny_models["tiny_qwen3"]
    ids = prompt(10)
    target = prompt(11, length=12)
    with torch.inference_mode():
        logits = model(torch.tensor([ids + target])).logits[0, len(ids) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(target)[:, None])[:, 0]
    full = Engine(model, FullCache()).generate(Request(ids, 1, forced=target))
    assert full.tokens == target
    torch.testing.assert_close(torch.tensor(full.target_logprobs), expected, rtol=1e-4, atol=1e-4)
    engine = Engine(model, named_method("inertia", "rho=0.5"))
    steps = record_steps(engine)
    evicted = engine.generate(Request(ids, 1, forced=target))
    assert evicted.tokens == target
    assert all(s["lengths"][0] == PROMPT_LEN // 2 for s in steps[1:])
    # The first two targets are scored before any eviction; later ones see the smaller cache.
    torch.testing.assert_close(torch.tensor(evicted.target_logprobs[:2]), expected[:2], rtol=1e-4, atol=1e-4)
    assert evicted.target_logprobs[2:] != full.target_logprobs[2:]


def test_min_new_tokens_suppresses_stop_tokens(tiny_models):
    model = tiny_models["tiny_llama"]
    ids = prompt(12)
    free = Engine(model, FullCache()).generate(Request(ids, NEW_TOKENS)).tokens
    first = free[0]
    stopped = Engine(model, FullCache()).generate(Request(ids, NEW_TOKENS, stop_token_ids={first})).tokens
    assert stopped == [first]
    held = (
        Engine(model, FullCache()).generate(Request(ids, NEW_TOKENS, stop_token_ids={first}, min_new_tokens=1)).tokens
    )
    assert held[0] != first
    assert len(held) > 1


def test_method_time_in_the_prefill_stays_out_of_the_decode_shares(tiny_models):
    model = tiny_models["tiny_llama"]
    method = named_method("h2o", "rho=0.5")
    observe_prefill = method.observe_prefill

    def slow(view):
        time.sleep(0.1)
        observe_prefill(view)

    method.observe_prefill = slow
    generation = Engine(model, method, profile=True).generate(Request(prompt(1), 3))
    layers = model.config.num_hidden_layers
    assert generation.prefill_s >= generation.prefill_score_s >= 0.1 * layers
    assert generation.score_s < 0.1 and generation.evict_s < 0.1
    # Unprofiled, a step is one timed interval: the decode shares are not measured.
    plain = Engine(model, named_method("h2o", "rho=0.5")).generate(Request(prompt(1), 3))
    assert plain.score_s is None and plain.evict_s is None
    unscored = Engine(model, named_method("streaming_llm", "rho=0.5")).generate(Request(prompt(1), 3))
    assert unscored.prefill_score_s < 0.1
    assert generation.cache_len_final == generation.budget


BASELINES = ("adakv_ea", "keydiff", "kvzip", "kvzip_mask")


@pytest.mark.parametrize("model_name", TINY_MODELS)
def test_no_eviction_matches_generate_for_the_paper_baselines(tiny_models, model_name, tmp_path):
    model = tiny_models[model_name]
    ids = prompt(1)
    expected = reference(model, ids)
    config = model.config
    info = BilinearInfo(model_name, config.num_hidden_layers, config.num_attention_heads,
                        config.num_key_value_heads, config.head_dim, 8, per_layer=False)  # fmt: skip
    head = tmp_path / "head.safetensors"
    save_bilinear(BilinearHead(1, info.query_heads * info.head_dim, info.kv_heads * info.head_dim, 8), str(head), info)
    named = [(name, ()) for name in BASELINES] + [
        ("bilinear", (f"model={model_name}", f"method.scorer.checkpoint={head}"))
    ]
    for name, extra in named:
        # A budget beyond the prompt: every scoring path runs, nothing is evicted (rho=0 never scores).
        # kvzip_mask pools kvpress's count, which follows rho alone: the budget's count takes the fixed budget.
        pool = ("method.pool=budget",) if name == "kvzip_mask" else ()
        method = named_method(name, "rho=0.5", "method.selection.budget_tokens=100000", *pool, *extra)
        assert Engine(model, method).generate(Request(ids, NEW_TOKENS)).tokens == expected, (
            f"{name} diverged from model.generate"
        )


def test_ragged_attention_equals_padded_attention_with_masked_padding():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 6, 1, 16, generator=generator)
    lengths = [7, 3, 12]
    keys = tuple(torch.randn(n, 16, generator=generator) for n in lengths)
    values = tuple(torch.randn(n, 16, generator=generator) for n in lengths)
    output, weights = ragged_single_query_attention(query, keys, values, 0.25, None)
    padded_keys = torch.zeros(1, 3, 12, 16)
    padded_values = torch.zeros(1, 3, 12, 16)
    bias = torch.full((3, 12), -torch.inf)
    for head, n in enumerate(lengths):
        padded_keys[0, head, :n], padded_values[0, head, :n], bias[head, :n] = keys[head], values[head], 0.0
    expected, expected_weights = single_query_attention(query, padded_keys, padded_values, 0.25, bias)
    torch.testing.assert_close(output, expected)
    for head, n in enumerate(lengths):
        torch.testing.assert_close(weights[head], expected_weights[head, :, :n])


def test_ragged_layers_pack_exactly_their_entries_and_grow_per_head(tiny_models):
    model = tiny_models["tiny_qwen2"]
    cache = kv_cache.new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt(2, length=10)]), cache=cache, use_cache=True)
    full_keys, full_values = kv_cache.layer_heads(cache, 0)
    kv_cache.evict_layer(cache, 0, (torch.tensor([0, 3, 9]), torch.tensor([5])))
    layer = cache.layers[0]
    assert isinstance(layer, kv_cache.RaggedLayer) and layer.keys.shape == (1, 4, 16)
    assert kv_cache.head_lengths(cache)[0] == [3, 1] and kv_cache.cache_lengths(cache)[0] == 3
    keys, values = kv_cache.layer_heads(cache, 0)
    torch.testing.assert_close(keys[0], full_keys[0][[0, 3, 9]])
    torch.testing.assert_close(values[1], full_values[1][[5]])
    new_keys, new_values = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
    layer.update(new_keys, new_values)
    keys, values = kv_cache.layer_heads(cache, 0)
    assert [k.shape[0] for k in keys] == [4, 2]
    torch.testing.assert_close(keys[1][-1], new_keys[0, 1, 0])
    torch.testing.assert_close(values[0][:3], full_values[0][[0, 3, 9]])
    entry = 2 * 16 * 4
    other_layers = (model.config.num_hidden_layers - 1) * 2 * 10 * entry
    assert kv_cache.cache_bytes(cache) == 6 * entry + other_layers
    assert kv_cache.bytes_per_token(cache) == model.config.num_hidden_layers * 2 * entry
    # Equal counts make the layer plain again.
    kv_cache.evict_layer(cache, 0, (torch.tensor([1, 2]), torch.tensor([0, 1])))
    assert not isinstance(cache.layers[0], kv_cache.RaggedLayer) and cache.layers[0].keys.shape == (1, 2, 2, 16)


def test_full_cache_memory_figures(tiny_models):
    model = tiny_models["tiny_llama"]
    result = Engine(model, FullCache()).generate(Request(prompt(3), 5))
    size = model.dtype.itemsize
    per_token = model.config.num_hidden_layers * model.config.num_key_value_heads * 2 * model.config.head_dim * size
    assert result.kv_bytes_final == result.kv_bytes_full == (PROMPT_LEN + 4) * per_token
    if model.device.type == "cuda":
        # There the peaks are the allocator's: weights and activations on top of the cache.
        assert result.prefill_peak_bytes > PROMPT_LEN * per_token and result.decode_peak_bytes > result.kv_bytes_final
    else:
        assert result.prefill_peak_bytes == PROMPT_LEN * per_token
        assert result.decode_peak_bytes == result.kv_bytes_final
    assert result.kv_entries_final == PROMPT_LEN + 4
    # Preallocated for every token the sequence can reach, and all of them reached.
    assert result.slot_bytes_final == result.kv_bytes_final
