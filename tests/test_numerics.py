"""``numerics`` 2 (``harness.decode.engine.NUMERICS``): a ragged layer's KV heads padded to one length
(``kv_cache.PaddedHeadsLayer``), appended with one write and attended in one masked pass."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from conftest import named_method, tiny_spec
from test_batching import TIMINGS, alone_and_batched, figures, prompts
from test_steady import _Steps, prompt

from harness.config import model_spec
from harness.decode import kv_cache
from harness.decode.attention import AttentionCall
from harness.decode.counting import counting
from harness.decode.engine import Engine, Request
from harness.decode.evicting_attention import BatchState, _batched, _padded, ragged_single_query_attention
from harness.models import load_model, load_tokenizer

LENGTHS = [5, 2, 7]


def heads(lengths: list[int], seed: int = 0, dim: int = 4) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    keys = [torch.randn(1, n, dim, generator=generator) for n in lengths]
    return keys, [torch.randn(1, n, dim, generator=generator) for n in lengths]


def test_a_padded_layer_appends_and_drops_what_a_packed_one_does_and_counts_only_its_entries():
    keys, values = heads(LENGTHS)
    padded = kv_cache.PaddedHeadsLayer(keys, values, room=2)
    packed = kv_cache.RaggedLayer(torch.cat(keys, 1), torch.cat(values, 1), list(LENGTHS))
    assert padded.held_bytes() == 2 * 3 * (7 + 2) * 4 * 4
    for step in range(3):  # the third append outgrows the room and reallocates
        new_keys, new_values = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
        returned, _ = padded.update(new_keys, new_values)
        packed.update(new_keys, new_values)
        assert returned.shape == (1, 3, 7 + step + 1, 4)
    padded.drop_newest(2)
    packed.drop_newest(2)
    assert padded.lengths == packed.lengths == [6, 3, 8] and padded.filled.tolist() == [6, 3, 8]
    for mine, theirs in zip(padded.heads(), packed.heads(), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert padded.entry_bytes() == 2 * (6 + 3 + 8) * 4 * 4
    # The free slots past each head hold zeros or dropped entries: finite, so a zero weight keeps them out.
    assert torch.isfinite(padded.keys).all() and torch.isfinite(padded.values).all()


def test_a_cut_into_heads_of_different_counts_makes_a_padded_layer_with_room_for_the_tokens_to_come():
    model = load_model(tiny_spec("tiny_llama"))
    cache = kv_cache.new_cache(model, capacity=9, limit=20, padded_heads=True)
    layer = cache.layers[0]
    layer.update(torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
    kv_cache.evict_layer(cache, 0, (torch.tensor([0, 3, 5]), torch.tensor([1])))
    cut = cache.layers[0]
    assert isinstance(cut, kv_cache.PaddedHeadsLayer) and cut.lengths == [3, 1]
    assert cut._keys.shape[-2] == 3 + 12  # the longest head, and the 12 tokens the slot layer still expected
    assert kv_cache.cache_bytes(cache) == cut.entry_bytes() == 2 * 4 * 16 * 4
    keys, _ = kv_cache.layer_heads(cache, 0)
    assert torch.equal(keys[0], layer.keys[0, 0, [0, 3, 5]]) and torch.equal(keys[1], layer.keys[0, 1, [1]])


@pytest.mark.parametrize("scored", [True, False])
@pytest.mark.parametrize("biased", [False, True])
def test_the_padded_pass_gives_the_per_head_pass_outputs_and_weights(scored, biased):
    keys, values = heads(LENGTHS, dim=8)
    layer = kv_cache.PaddedHeadsLayer(keys, values, room=3)
    query = torch.randn(1, 6, 1, 8, generator=torch.Generator().manual_seed(1))
    bias = tuple(torch.randn(n).masked_fill(torch.arange(n) == 1, -torch.inf) for n in LENGTHS) if biased else None
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups, module.is_causal = 0, 2, True
    call = AttentionCall(module, query, layer.keys, layer.values, None, 8**-0.5, {})
    output, weights = _padded(call, layer.filled, LENGTHS, bias, scored or biased)
    per_head = [k[0] for k in keys], [v[0] for v in values]
    expected, expected_weights = ragged_single_query_attention(query, *per_head, 8**-0.5, bias)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
    if not (scored or biased):
        assert weights is None
        return
    assert [w.shape for w in weights] == [w.shape for w in expected_weights]
    for mine, theirs in zip(weights, expected_weights, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name,extra", [("adakv_ea", ()), ("adakv_ea", ("method.schedule=decode",)), ("kvzip", ())])
def test_numerics_2_records_what_the_reference_does_on_the_ragged_presets(tiny_models, name, extra):
    # On this stack the padded pass rounds as the per-head one does at these sizes: every figure is equal but the
    # memory held, which the padding can only raise.
    model = tiny_models["tiny_llama"]
    tokenizer = load_tokenizer(model_spec("tiny_llama"))
    request = Request(prompt(), 24, stop_token_ids={999_999})
    made = {}
    for numerics in (1, 2):
        method = named_method(name, "model=tiny_llama", "rho=0.5", *extra)
        made[numerics] = dataclasses.asdict(
            Engine(model, method, tokenizer=tokenizer, numerics=numerics).generate(request)
        )
    reference, padded = ({k: v for k, v in g.items() if k not in TIMINGS | {"slot_bytes_final"}} for g in made.values())
    assert padded == reference
    assert made[2]["slot_bytes_final"] >= made[1]["slot_bytes_final"]
    if not extra:  # a prefill-time cut leaves heads of different counts, now padded to the longest
        assert made[2]["slot_bytes_final"] > made[1]["slot_bytes_final"]


def kernels_per_step(model, numerics: int) -> list:
    steps: list = []
    engine = Engine(model, named_method("adakv_ea", "model=tiny_llama", "rho=0.5"), token_lag=4, numerics=numerics)
    engine.around_step = lambda step: _Steps(steps, step)
    engine.generate(Request(prompt(), 20))
    return [counts for step, _, counts in steps if step > 8]


def padded_step_kernels(kv_heads: int, scored: bool) -> int:
    """Kernels of one append and one attention call on a padded layer of ``kv_heads`` heads."""
    lengths = [3 + 2 * head for head in range(kv_heads)]
    layer = kv_cache.PaddedHeadsLayer(*heads(lengths, dim=8), room=4)
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups, module.is_causal = 0, 2, True
    query, new = torch.randn(1, 2 * kv_heads, 1, 8), torch.randn(1, kv_heads, 1, 8)
    with counting() as counts:
        keys, values = layer.update(new, new)
        call = AttentionCall(module, query, keys, values, None, 8**-0.5, {})
        _padded(call, layer.filled, layer.lengths, None, scored)
    assert counts.sync_count == 0
    return sum(counts.kernels.values())


@pytest.mark.parametrize("scored", [True, False])
def test_a_padded_step_runs_as_many_kernels_whatever_the_heads(scored):
    assert padded_step_kernels(2, scored) == padded_step_kernels(8, scored)


def test_a_padded_step_reads_nothing_on_the_host_and_runs_fewer_kernels_than_the_reference():
    spec = tiny_spec("tiny_llama")
    model = load_model(
        dataclasses.replace(spec, config={**spec.config, "num_attention_heads": 8, "num_key_value_heads": 4})
    )
    padded, packed = kernels_per_step(model, 2), kernels_per_step(model, 1)
    assert padded and all(counts.sync_count == 0 for counts in padded)
    assert sum(padded[-1].kernels.values()) < sum(packed[-1].kernels.values())


@pytest.mark.parametrize("extra", [(), ("method.schedule=decode",)])
def test_padded_layers_batched_give_the_records_of_batch_one(tiny_models, extra):
    engine = Engine(tiny_models["tiny_llama"], named_method("adakv_ea", "rho=0.5", *extra), numerics=2)
    requests = [Request(ids, 12 + 2 * i, seed=i) for i, ids in enumerate(prompts(5))]
    alone, batched = alone_and_batched(engine, requests, 3)
    assert [figures(g) for g in alone] == [figures(batched[i]) for i in range(len(requests))]


def slot_caches(model, lengths: list[int], capacity: int = 12) -> list:
    caches = []
    for seed, length in enumerate(lengths):
        cache = kv_cache.new_cache(model, capacity, capacity)
        for layer in cache.layers:
            generator = torch.Generator().manual_seed(seed)
            layer.update(torch.randn(1, 2, length, 16, generator=generator), torch.randn(1, 2, length, 16))
        caches.append(cache)
    return caches


def test_shared_slots_hold_each_rows_entries_in_views_and_append_at_each_rows_and_heads_own_slot(tiny_models):
    caches = slot_caches(tiny_models["tiny_llama"], [3, 7, 5])
    # Row 2's first layer has heads of different counts.
    padded = kv_cache.PaddedHeadsLayer(*heads([5, 2], dim=16), room=4)
    caches[2].layers[0] = padded
    before = [[(layer.keys.clone(), layer.held_bytes()) for layer in cache.layers] for cache in caches]
    shared = kv_cache.SharedSlots(caches, group=2)
    assert shared.holds(caches) and not shared.holds(caches[::-1])
    for cache, layers in zip(caches, before, strict=True):
        for layer, (keys, held) in zip(cache.layers, layers, strict=True):
            assert torch.equal(layer.keys, keys) and layer.held_bytes() == held
    # One step: every layer appends in order; the counts advance once, at the last layer.
    new = torch.randn(3, 2, 1, 16)
    keys = [shared.append(layer, new, new)[0] for layer in range(len(caches[0].layers))]
    assert keys[0].shape == (3, 2, 8, 16) and shared.filled[0].tolist() == [[4, 4], [8, 8], [6, 3]]
    assert shared.filled[1:].tolist() == [[[4, 4], [8, 8], [6, 6]]] * (len(keys) - 1)
    for row, cache in enumerate(caches[:2]):
        layer = cache.layers[0]
        assert layer.length == [4, 8][row] and torch.equal(layer.keys[0, :, -1], new[row, :, 0])
    assert padded.lengths == [6, 3] and padded.filled.tolist() == [6, 3]
    assert [head[0, -1].tolist() for head in padded.heads()[0]] == new[2, :, 0].tolist()
    # The step's mask: each query head attends its KV head's entries, the new one included.
    expected = torch.arange(8)[None, None, :] < torch.tensor([[4, 4], [8, 8], [6, 3]])[..., None]
    assert torch.equal(shared.attended(0, 8), expected.repeat_interleave(2, dim=1)[:, :, None, :])
    # Rows of slot layers alone, whose heads hold as many entries: one mask row per row.
    plain = kv_cache.SharedSlots(slot_caches(tiny_models["tiny_llama"], [3, 7]), group=2)
    plain.append(0, new[:2], new[:2])
    assert torch.equal(plain.attended(0, 8), (torch.arange(8) < torch.tensor([[4], [8]]))[:, None, None, :])
    # A row that outgrows its slots reallocates: the buffer no longer holds it.
    caches[1].layers[2].update(torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16))
    assert not shared.holds(caches)


def shared_step_kernels(model, rows: int) -> Counter:
    """Kernels of one shared step's appends and attention calls, every layer's, over ``rows`` rows of different
    lengths."""
    caches = slot_caches(model, [3 + 2 * row for row in range(rows)], capacity=20)
    assert kv_cache.SharedSlots.fits(caches)
    shared = kv_cache.SharedSlots(caches, group=2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    new, query = torch.randn(rows, 2, 1, 16), torch.randn(rows, 4, 1, 16)
    batch = BatchState([], shared)
    with counting() as counts:
        for layer in range(len(caches[0].layers)):
            keys, values = shared.append(layer, new, new)
            module.layer_idx = layer
            _batched(batch, AttentionCall(module, query, keys, values, None, 0.25, {}))
    assert counts.sync_count == 0
    return counts.kernels


def test_a_shared_batch_step_runs_as_many_kernels_whatever_the_rows_and_two_for_its_counts(tiny_models):
    two, six = shared_step_kernels(tiny_models["tiny_llama"], 2), shared_step_kernels(tiny_models["tiny_llama"], 6)
    assert two == six
    layers = len(tiny_models["tiny_llama"].model.layers)
    # The step's mask for every layer in one comparison and every count advanced in one add; a layer writes
    # its keys and its values and attends once.
    attends = sum(count for name, count in two.items() if "scaled_dot_product" in name)
    assert (two["le"], two["add_"], two["index_put_"], attends) == (1, 1, 2 * layers, layers)
    assert not {"arange", "ge", "bitwise_not", "copy_"} & set(two)


@pytest.mark.parametrize("name", ["full", "snapkv", "keydiff", "adakv_ea", "kvzip"])
def test_rows_that_only_append_share_one_buffer_and_give_the_records_of_batch_one(tiny_models, monkeypatch, name):
    # Slot layers (full, SnapKV, KeyDiff) and padded heads (AdaKV+EA, KVzip) alike.
    appended = []
    original = kv_cache.SharedSlots.append
    monkeypatch.setattr(kv_cache.SharedSlots, "append", lambda self, *a: appended.append(1) or original(self, *a))
    tokenizer = load_tokenizer(model_spec("tiny_llama"))
    method = named_method(name, "rho=0.5")
    engine = Engine(tiny_models["tiny_llama"], method, tokenizer=tokenizer, numerics=2, token_lag=4)
    requests = [Request(ids, 14 + 3 * i, seed=i) for i, ids in enumerate(prompts())]
    alone, batched = alone_and_batched(engine, requests, 3)
    assert [figures(g) for g in alone] == [figures(batched[i]) for i in range(len(requests))]
    assert len(appended) > 3 * 20  # three layers, most batch steps
