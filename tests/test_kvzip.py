"""KVzip: reconstruction scores on hand-built keys and queries, the pooled budget (ours and kvpress's count), the
mask mode, the readings of what is reconstructed (the chat template's parts found with the tokenizer), the passes'
token ids, and the method on a tiny model (the passes read the prompt's cache as one long forward would)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import named_method, refused

from harness.config import model_spec
from harness.decode import kv_cache
from harness.decode.engine import Engine, Request, sequence_info
from harness.decode.evicting_attention import EVICTING, StepState
from harness.decode.reconstruction import reconstructed_span, reconstruction_passes, template_parts
from harness.errors import UserError, user_errors
from harness.models import load_tokenizer
from methods.base import LayerView, Reconstruction, SequenceInfo
from methods.driver import Driver
from methods.kvzip import ContextReconstruction, KVzip
from methods.selection import Selection


def kvzip(budget: int, sinks: int = 0, **options) -> KVzip:
    return KVzip(Selection(budget_tokens=budget, sinks=sinks, granularity="head"), **options)


def test_scores_are_the_most_attention_a_reconstructing_query_pays():
    method = kvzip(budget=2)
    method.begin(SequenceInfo(6, 1, 1, 1, 4))
    prompt_keys = torch.eye(8)[:6]
    keys = torch.cat([prompt_keys, torch.zeros(2, 8)])[None]
    c = math.log(4.0)
    queries = torch.zeros(1, 2, 8)
    queries[0, 0, 2] = c
    queries[0, 1, 4] = c
    view = LayerView(0, keys, keys, torch.arange(6)[None], queries=queries, scaling=1.0)
    method.observe_reconstruction(view, 0, 6)
    # Query 0 sees the 6 prompt entries and its own: 4 / (4 + 5 + 1) on entry 2, 1/10 elsewhere.
    # Query 1 sees both pass entries: 4 / 11 on entry 4, 1/11 elsewhere. The score is the larger.
    expected = torch.tensor([0.1, 0.1, 0.4, 0.1, 4 / 11, 0.1])
    torch.testing.assert_close(method.scores[0, 0], expected)


def test_later_chunks_attend_to_the_sinks_their_span_and_themselves():
    method = kvzip(budget=2, sinks=2)
    method.begin(SequenceInfo(6, 1, 1, 1, 4))
    keys = torch.cat([torch.eye(8)[:6], torch.zeros(1, 8)])[None]
    queries = torch.zeros(1, 1, 8)
    queries[0, 0, 1] = math.log(3.0)  # a sink: in the softmax, not scored
    queries[0, 0, 4] = math.log(2.0)
    view = LayerView(0, keys, keys, torch.arange(6)[None], queries=queries, scaling=1.0)
    method.observe_reconstruction(view, 3, 6)
    # Keys: sinks 0, 1 (logits 0, log 3), span 3, 4, 5 (0, log 2, 0), the pass entry (0): sum 1+3+1+2+1+1 = 9.
    torch.testing.assert_close(method.scores[0, 0], torch.tensor([0.0, 0.0, 0.0, 1 / 9, 2 / 9, 1 / 9]))


def scored_method(**options) -> KVzip:
    method = kvzip(budget=2, sinks=1, **options)
    method.begin(SequenceInfo(6, 2, 2, 2, 4))
    method.scores = torch.tensor(
        [
            [[0.0, 0.9, 0.8, 0.75, 0.7, 0.1], [0.0, 0.1, 0.1, 0.1, 0.1, 0.1]],
            [[0.0, 0.3, 0.2, 0.05, 0.05, 0.05], [0.0, 0.25, 0.05, 0.05, 0.05, 0.05]],
        ]
    )
    return method


def plan_lists(plan) -> list[list[list[int]]]:
    return [[row.tolist() for row in layer] for layer in plan]


def test_the_budget_is_pooled_over_every_layer_and_head():
    method = scored_method()
    prompt = [torch.arange(6).expand(2, -1)] * 2
    # 2 layers x 2 heads x B=2 = 8 entries: the 4 sinks, then 0.9, 0.8, 0.75, 0.7, all in layer 0.
    assert plan_lists(method.keep(0, prompt)) == [[[0, 1, 2, 3, 4], [0]], [[0], [0]]]
    layerwise = scored_method(layerwise=True)
    # 4 per layer: layer 0 adds 0.9 and 0.8, layer 1 adds 0.3 and 0.25.
    assert plan_lists(layerwise.keep(0, prompt)) == [[[0, 1, 2], [0]], [[0, 1], [0, 1]]]


def test_mask_mode_keeps_everything_and_hides_the_evicted_from_attention():
    method = scored_method(mode="mask")
    prompt = [torch.arange(6).expand(2, -1)] * 2
    assert method.keep(0, prompt) is None
    with_new_token = torch.arange(7).expand(2, -1)
    bias = method.logit_bias(0, with_new_token)
    inf = -torch.inf
    assert bias.tolist() == [[0, 0, 0, 0, 0, inf, 0], [0, inf, inf, inf, inf, inf, 0]]
    assert method.logit_bias(1, with_new_token).tolist() == [[0, inf, inf, inf, inf, inf, 0]] * 2


def reconstructed_method(rho: float, **options) -> KVzip:
    """Two layers of two heads over 8 prompt positions, the passes covering positions 2-5 (an opening of
    2 entries, 1 of them a sink, and a closing of 2), then hand-set scores."""
    method = KVzip(Selection(rho=rho, sinks=1, granularity="head"), context="user_content", **options)
    method.begin(SequenceInfo(8, 2, 2, 2, 4))
    for layer in range(2):
        keys = torch.zeros(2, 10, 8)
        view = LayerView(layer, keys, keys, torch.arange(8).expand(2, -1), queries=torch.zeros(2, 2, 8))
        method.observe_reconstruction(view, 2, 6)
    falling = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.1] * 4, [0.5, 0.4, 0.3, 0.2], [0.05] * 4])
    method.scores = torch.zeros(2, 2, 8)
    method.scores[..., 2:6] = falling.view(2, 2, 4)
    return method


def test_the_closing_is_kept_whole_and_the_opening_goes_first():
    prompt = [torch.arange(8).expand(2, -1)] * 2
    # B = 4 per head, 16 in all: the 4 sinks and 8 closing entries, then the 4 best (layer 0, head 0).
    budget = reconstructed_method(0.5)
    assert plan_lists(budget.keep(0, prompt)) == [[[0, 2, 3, 4, 5, 6, 7], [0, 6, 7]], [[0, 6, 7], [0, 6, 7]]]
    # kvpress's count: of the 4 x 6 entries before the closing it prunes int(24 * 0.5) = 12, then the closing joins.
    kvpress = reconstructed_method(0.5, pool="kvpress")
    both = [[0, 2, 3, 4, 5, 6, 7], [0, 6, 7]]
    assert plan_lists(kvpress.keep(0, prompt)) == [both, both]
    # Position 1, the opening's unscored entry, is never kept; B = 2 cannot hold a sink and the closing.
    refused(lambda: reconstructed_method(0.75).keep(0, prompt), "budget B=2 cannot hold the 1 sinks and the 2 entries")


def test_kvpress_counts_its_pool_up_where_the_budget_counts_down():
    method = reconstructed_method(0.7, pool="kvpress")
    # 24 entries before the closing: int(24 * 0.7) = 16 pruned, 8 kept (B's floor would keep 7) + 8 closing.
    assert method._kept(4, 6) == 24 - 16 + 8
    assert reconstructed_method(0.5)._kept(4, 6) == 4 * 4


def test_mistakes_are_refused_in_one_line():
    def configured(*overrides: str) -> KVzip:
        with user_errors():
            return named_method("kvzip", *overrides)

    refused(lambda: configured("method.mode=masked"), "method.mode='masked'", UserError)
    refused(lambda: configured("+method.context=template"), "method.context='template'", UserError)
    refused(lambda: configured("+method.pool=floor"), "method.pool='floor'", UserError)
    fixed = ("+method.pool=kvpress", "method.selection.budget_tokens=64")
    refused(lambda: configured(*fixed), "method.pool=kvpress", UserError)
    refused(lambda: configured("method.selection.granularity=layer"), "granularity='layer'", UserError)
    refused(lambda: configured("method.chunk=0"), "method.chunk=0", UserError)


class CharTokenizer:
    """One id per character, no chat template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_passes_repeat_each_chunk_after_the_instruction():
    spec = Reconstruction(chunk=5, first="F", later="L", overlap=3)
    prompt = list(range(100, 112))
    newline = [ord("\n")]
    assert reconstruction_passes(CharTokenizer(), prompt, spec) == [
        (0, 5, [ord("F"), *newline, *prompt[0:5]]),
        (5, 10, [ord("L"), *prompt[2:5], *newline, *prompt[5:10]]),
        (10, 12, [ord("L"), *prompt[7:10], *newline, *prompt[10:12]]),
    ]


def test_the_template_parts_come_from_the_chat_template():
    tokenizer = load_tokenizer(model_spec("smollm2_135m"))
    opening, closing = template_parts(tokenizer)
    assert tokenizer.decode(opening).startswith("<|im_start|>system\n")
    assert tokenizer.decode(opening).endswith("<|im_end|>\n<|im_start|>user\n")
    assert tokenizer.decode(closing) == "<|im_end|>\n<|im_start|>assistant\n"
    assert template_parts(CharTokenizer()) == ([], [])


def chat_prompt(tokenizer, turns: list[str], answer_prefix: str = " The answer is") -> list[int]:
    """A prompt as the RULER task builds it: earlier turns, the user turn, the answer prefix after the template."""
    messages = [{"role": role, "content": text} for role, text in zip(("user", "assistant") * 4, turns, strict=False)]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text + answer_prefix, add_special_tokens=False)


@pytest.mark.parametrize("turns", [["Some context.\nWhat is it?"], ["First.", "Reply.", "Some context.\nWhat is it?"]])
def test_the_readings_reconstruct_the_prompt_after_the_opening_or_the_user_content(turns: list[str]):
    tokenizer = load_tokenizer(model_spec("smollm2_135m"))
    opening, closing = template_parts(tokenizer)
    ids = chat_prompt(tokenizer, turns)
    assert reconstructed_span(ids, opening, closing, "whole_prompt") == (0, len(ids))
    assert reconstructed_span(ids, opening, closing, "after_template") == (len(opening), len(ids))
    start, end = reconstructed_span(ids, opening, closing, "user_content")
    assert start == len(opening) and tokenizer.decode(ids[start:end]).endswith("Some context.\nWhat is it?")
    assert tokenizer.decode(ids[end:]) == "<|im_end|>\n<|im_start|>assistant\n The answer is"
    # A prompt without the template's parts (chat_template=false) is reconstructed whole.
    raw = tokenizer.encode("Some context.\nWhat is it? The answer is", add_special_tokens=False)
    assert reconstructed_span(raw, opening, closing, "user_content") == (0, len(raw))


def test_passes_of_the_user_content_chunk_it_from_its_start():
    tokenizer = load_tokenizer(model_spec("smollm2_135m"))
    opening, closing = template_parts(tokenizer)
    ids = chat_prompt(tokenizer, ["one two three four five six seven eight nine ten eleven twelve"])
    start, end = reconstructed_span(ids, opening, closing, "user_content")
    spec = ContextReconstruction(chunk=5, first="F", later="L", overlap=3, context="user_content")
    passes = reconstruction_passes(tokenizer, ids, spec)
    assert [(a, b) for a, b, _ in passes] == [(a, min(a + 5, end)) for a in range(start, end, 5)]
    first, later = tokenizer.encode("F"), tokenizer.encode("L")
    assert passes[0][2] == first + closing + ids[start : start + 5]
    assert passes[1][2] == later + ids[start + 2 : start + 5] + closing + ids[start + 5 : start + 10]


# ------------------------------------------------------------------------------------------ on a model
PROMPT_LEN = 96


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(model_spec("tiny_llama"))


def prompt(seed: int) -> list[int]:
    return torch.randint(0, 49152, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_pass_reads_the_prompt_cache_as_one_long_forward_would(tiny_models, tokenizer):
    model = tiny_models["tiny_qwen3"]
    ids, again = prompt(1), prompt(2)[:30]
    engine = Engine(model, named_method("kvzip", "rho=0.5"), tokenizer=tokenizer)
    cache = kv_cache.new_cache(model)
    state = StepState(Driver(engine.method, sequence_info(model.config, PROMPT_LEN, 4, model=model)), cache)
    with EVICTING.active(state):
        engine._forward(ids, 0, cache)
    before = [k.clone() for k, _ in kv_cache.layer_tensors(cache)]
    state.driver.begin_reconstruction(0, PROMPT_LEN)
    with EVICTING.active(state), torch.inference_mode():
        logits = engine._forward(again, PROMPT_LEN, cache)
    with torch.inference_mode():
        expected = model(torch.tensor([ids + again])).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    kv_cache.truncate(cache, PROMPT_LEN)
    for kept, original in zip(kv_cache.layer_tensors(cache), before, strict=True):
        assert torch.equal(kept[0], original)


def test_evict_and_mask_modes_decode_alike_and_count_memory_apart(tiny_models, tokenizer):
    model = tiny_models["tiny_llama"]
    ids = prompt(3)
    layers, heads, dim = model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim
    entry = 2 * dim * 4
    budget, new = PROMPT_LEN // 4, 6
    passes = []
    outcomes = {}
    for name in ("kvzip", "kvzip_mask"):
        method = named_method(name, "rho=0.75", "method.chunk=40")
        observe = method.observe_reconstruction
        method.observe_reconstruction = lambda view, start, end, observe=observe: (
            passes.append((start, end, view.layer)),
            observe(view, start, end),
        )
        engine = Engine(model, method, tokenizer=tokenizer)
        lengths = []
        engine.on_step = lambda step, context, cache, lengths=lengths: lengths.append(kv_cache.head_lengths(cache))
        outcomes[name] = (engine.generate(Request(ids, new)), lengths)
    assert {(start, end) for start, end, _ in passes} == {(0, 40), (40, 80), (80, 96)}
    assert len(passes) == 2 * 3 * layers
    evicted, evict_lengths = outcomes["kvzip"]
    masked, mask_lengths = outcomes["kvzip_mask"]
    assert evicted.tokens == masked.tokens
    # The record says which mode ran (its meta), also for method=kvzip method.mode=mask.
    assert (evicted.method_report, masked.method_report) == ({"kvzip_mode": "evict"}, {"kvzip_mode": "mask"})
    # Attention over the ragged heads and over the masked full ones gives the same distributions.
    forced = {name: Engine(model, named_method(name, "rho=0.75"), tokenizer=tokenizer) for name in outcomes}
    logprobs = {
        name: engine.generate(Request(ids, 1, forced=prompt(4)[:8])).target_logprobs for name, engine in forced.items()
    }
    torch.testing.assert_close(torch.tensor(logprobs["kvzip"]), torch.tensor(logprobs["kvzip_mask"]))
    # Evict: L * H * B prompt entries in all, spread unevenly over layers and heads.
    assert sum(sum(lengths) for lengths in evict_lengths[0]) == layers * heads * budget
    assert len({n for lengths in evict_lengths[0] for n in lengths}) > 1
    steps = new - 1
    assert evicted.kv_bytes_final == layers * heads * (budget + steps) * entry
    assert masked.kv_bytes_final == masked.kv_bytes_full == layers * heads * (PROMPT_LEN + steps) * entry
    assert mask_lengths[-1] == [[PROMPT_LEN + steps] * heads] * layers
    assert evicted.kv_entries_final == masked.kv_entries_final == budget + steps
    # Masking hides entries from attention but holds them: retained (held) entries are the full cache's.
    assert evicted.kv_entries_held == budget + steps and masked.kv_entries_held == PROMPT_LEN + steps
    # The prefill peak holds the prompt and the longest pass (the 40-token chunk after its instruction).
    spec = Reconstruction(40, KVzip.first, KVzip.later, KVzip.overlap)
    longest = max(len(pass_ids) for *_, pass_ids in reconstruction_passes(tokenizer, ids, spec))
    assert evicted.prefill_peak_bytes == layers * heads * (PROMPT_LEN + longest) * entry


def test_user_content_keeps_the_template_closing_and_scores_the_content_only(tiny_models, tokenizer):
    model = tiny_models["tiny_llama"]
    words = " ".join(f"w{i}" for i in range(60))
    ids = chat_prompt(tokenizer, [words])
    opening, closing = template_parts(tokenizer)
    start, end = reconstructed_span(ids, opening, closing, "user_content")
    method = named_method("kvzip_mask", "rho=0.75", "method.chunk=40", "method.mode=evict")
    spans = set()
    observe = method.observe_reconstruction
    method.observe_reconstruction = lambda view, a, b: (spans.add((a, b)), observe(view, a, b))
    engine = Engine(model, method, tokenizer=tokenizer)
    kept = []
    engine.on_step = lambda step, state, cache: kept.append(state.driver.positions) if step == 0 else None
    engine.generate(Request(ids, 2))
    assert sorted(spans) == [(a, min(a + 40, end)) for a in range(start, end, 40)]
    rows = [row for layer in kept[0] for row in (layer if isinstance(layer, tuple) else layer.unbind(0))]
    tail = set(range(end, len(ids)))
    assert all(tail | set(range(4)) <= set(row.tolist()) for row in rows)
    # The opening's entries beyond the sinks are unscored, so they go first.
    assert not any(set(range(4, start)) & set(row.tolist()) for row in rows)
    numel = len(rows) * end
    assert sum(len(row) for row in rows) == numel - int(numel * 0.75) + len(rows) * len(tail)
