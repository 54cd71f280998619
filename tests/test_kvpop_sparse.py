"""KVpop distillation pattern: Fenwick running top-k, equality with the engine's physical eviction, KL."""

from __future__ import annotations

import pytest
import torch
from test_kvpop import kvpop_method, tiny_checkpoint

from harness.config import compose_config
from harness.engine import Engine
from harness.training.kvpop.sparse import distillation_loss, kvpop_mask, streaming_mask


def test_fenwick_mask_matches_brute_force_top_k():
    priority = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    sinks, window, k = 2, 4, 6
    mask = kvpop_mask(priority, sinks, window, k)
    for row in range(3):
        for query in range(50):
            older = sorted(range(sinks, query - window), key=lambda t: -priority[row, t])[:k]
            fixed = {t for t in range(query + 1) if t < sinks or t >= query - window}
            assert set(mask[row, query].nonzero().flatten().tolist()) == fixed | set(older), (row, query)


def test_mask_is_the_attention_pattern_the_engine_produces(tiny_models, tmp_path):
    method = kvpop_method(tiny_checkpoint(tmp_path, "mlp"), "tiny_llama", "rho=0.5", method="kvpop_mlp")
    kept = []
    engine = Engine(
        tiny_models["tiny_llama"],
        method,
        on_step=lambda step, context, cache: kept.append([p.clone() for p in context.positions]),
    )
    prompt = torch.randint(0, 49152, (96,), generator=torch.Generator().manual_seed(5)).tolist()
    engine.generate(prompt, 20)
    k = 48 - method.sinks - method.window
    for layer in range(3):
        # The MLP scores every token on insertion, so the static priorities of all positions are known.
        mask = kvpop_mask(method.base[layer], method.sinks, method.window, k)
        for step in range(1, 20):
            newest = 96 + step - 1
            # after step `step` the cache is what query newest + 1 attends to, less that new token
            expected = mask[:, newest + 1, : newest + 1]
            for head in range(2):
                assert kept[step][layer][head].tolist() == expected[head].nonzero().flatten().tolist(), (layer, step)


def test_distillation_loss_is_zero_without_eviction_and_trains_under_it(tiny_models):
    model = tiny_models["tiny_llama"]
    ids = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(6))
    dense = [torch.ones(64, 64, dtype=torch.bool).tril()[None]] * 3
    assert distillation_loss(model, ids, dense, 10).item() == pytest.approx(0.0, abs=1e-5)
    sparse = [streaming_mask(64, 2, 4, 6)[None]] * 3
    loss = distillation_loss(model, ids, sparse, 12)
    loss.backward()
    assert loss.item() > 0 and model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_training_with_distillation_saves_a_model(tmp_path):
    from harness.training.kvpop.train import train

    cfg = compose_config(
        "model=tiny_llama",
        "kvpop.sinks=2",
        "kvpop.window=8",
        "kvpop.k=16",
        "kvpop.scorer=mlp",
        "data.length=64",
        "data.windows=1",
        "data.skip=0",
        "train.steps=2",
        "distill.enabled=true",
        "distill.steps=2",
        f"distill.output={tmp_path}/distilled",
        f"output={tmp_path}/tiny.safetensors",
        config_name="train_kvpop",
    )
    summary = train(cfg)
    assert [point["step"] for point in summary["distill"]["history"]] == [1, 2]
    assert (tmp_path / "distilled" / "config.json").is_file()
