"""The kvpress peer check's evictbench side: keep sets read from the driver and compared head by head.

kvpress itself runs in its own environment (``scripts/kvpress_prefill.py``), never in CI; what it
returns is the same shape as ``prompt_keeps``'s output.
"""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from kvpress_peer_check import PEERS, agreement, kvpress_budget, ours, prompt_keeps

from harness.config import compose_config, model_spec
from harness.models import load_model, load_tokenizer
from methods.selection import exact_floor


def test_prompt_keeps_reads_plain_and_ragged_layers_and_drops_generated_positions() -> None:
    plain = torch.tensor([[0, 2, 5, 9], [1, 2, 3, 9]])
    ragged = (torch.tensor([4, 0, 9]), torch.tensor([3, 1, 2, 6, 9]))
    assert prompt_keeps([plain, ragged], prefill_len=9) == [[[0, 2, 5], [1, 2, 3]], [[0, 4], [1, 2, 3, 6]]]


def test_agreement_counts_equal_heads_and_the_jaccard_of_the_others() -> None:
    mine = [[[0, 1, 2], [3, 4]], [[5, 6], [7]]]
    ref = [[[0, 1, 2], [3, 5]], [[5, 6], [8]]]
    equal, total, jaccards = agreement(mine, ref)
    assert (equal, total) == (2, 4)
    assert jaccards == [1 / 3, 0.0]


def test_kvpress_budget_truncates_where_the_papers_floor_is_exact() -> None:
    assert kvpress_budget(890, 0.9) == 88 and exact_floor((1 - 0.9) * 890) == 89
    assert kvpress_budget(359, 0.9) == exact_floor((1 - 0.9) * 359) == 35
    assert kvpress_budget(3, 0.9) == 1


def test_every_peer_override_composes_on_its_preset() -> None:
    for peer in PEERS.values():
        cfg = compose_config(f"method={peer.preset}", "rho=0.5", *peer.overrides)
        assert cfg.method.name == peer.preset
        method = instantiate(cfg.method)
        if peer.preset.startswith("kvzip"):
            # KVzip is compared under kvpress's readings, counted as kvpress counts, its keep sets in the cache.
            assert (method.context, method.pool, method.mode) == (
                "after_template" if peer.preset == "kvzip" else "user_content",
                "kvpress",
                "evict",
            )
            assert peer.counts_kvpress


def test_ours_reports_the_keep_sets_after_the_prefill() -> None:
    spec = model_spec("tiny_llama")
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    ids = list(range(3, 43))
    result = ours(model, tokenizer, PEERS["keydiff"], 0.5, ids, new_tokens=3)
    heads = result["kept"][0]
    assert len(result["kept"]) == model.config.num_hidden_layers
    assert len(heads) == model.config.num_key_value_heads
    assert all(len(row) == 20 and row == sorted(row) and row[-1] < len(ids) for row in heads)
    assert 1 <= len(result["tokens"]) <= 3


def test_kvzip_counts_kvpress_entries_itself() -> None:
    spec = model_spec("tiny_llama")
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a b c " * 30}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    result = ours(model, tokenizer, PEERS["kvzip"], 0.9, ids, new_tokens=2)
    assert not result["matched"]
    heads = [row for layer in result["kept"] for row in layer]
    numel = len(heads) * len(ids)
    assert sum(map(len, heads)) == numel - int(numel * 0.9)
