"""Training-time attention patterns: the running top-k, equality with the engine's physical eviction, the KL."""

from __future__ import annotations

import pytest
import torch
from test_kvpop import kvpop_method, tiny_checkpoint

from harness.decode.attention import AttentionCall
from harness.decode.engine import Engine, Request
from harness.training.joint import distillation_kl
from harness.training.kvpop.sparse import attend_kept, attend_soft, kvpop_mask, streaming_drop, streaming_mask


def test_running_top_k_mask_matches_brute_force_top_k():
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
    engine.generate(Request(prompt, 20))
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


def call(length: int = 24, seed: int = 0) -> AttentionCall:
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(1, heads, length, 8, generator=generator) for heads in (4, 2, 2))
    module = torch.nn.Module()
    module.layer_idx = 0
    return AttentionCall(module, query, key, value, None, 8**-0.5, {})


def dense(c: AttentionCall, allowed: torch.Tensor) -> torch.Tensor:
    """Reference attention of ``c`` under a ``(heads, S, S)`` boolean mask, output ``(1, S, H, D)``."""
    key, value = c.key.repeat_interleave(2, dim=1), c.value.repeat_interleave(2, dim=1)
    logits = ((c.query @ key.transpose(-1, -2)) * c.scaling).masked_fill(~allowed, -torch.inf)
    return (logits.softmax(-1) @ value).transpose(1, 2)


def test_kept_attention_is_masked_softmax_and_gives_its_log_normalisers():
    c = call()
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    never = torch.full((2, 24), 24)  # no candidate is ever dropped: dense causal attention
    output, lse = attend_kept(c, never, 2, 4, "dense")
    assert torch.allclose(output, dense(c, causal.expand(4, -1, -1)), atol=1e-6)
    logits = (c.query @ c.key.repeat_interleave(2, dim=1).transpose(-1, -2)) * c.scaling
    assert torch.allclose(lse, logits.masked_fill(~causal, -torch.inf).logsumexp(-1)[0], atol=1e-5)
    drop = streaming_drop(1, 24, 4, 3, torch.device("cpu"))
    output, _ = attend_kept(c, drop, 2, 4, "dense")
    assert torch.allclose(output, dense(c, streaming_mask(24, 2, 4, 3).expand(4, -1, -1)), atol=1e-6)
    # streaming: sinks {0, 1}, then the w + k + 1 = 8 latest
    assert streaming_mask(24, 2, 4, 3)[20].nonzero().flatten().tolist() == [0, 1, *range(13, 21)]


def test_soft_eviction_bias_adds_log_keep_past_the_window():
    c = call(seed=1)
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    causal_output = dense(c, causal.expand(4, -1, -1))
    assert torch.allclose(attend_soft(c, torch.zeros(2, 24), 2, 4, "dense"), causal_output, atol=1e-6)
    # log(1 - alpha) = -inf past the window for every candidate: the streaming pattern with k = 0
    evicted = torch.full((2, 24), -torch.inf)
    streaming = dense(c, streaming_mask(24, 2, 4, 0).expand(4, -1, -1))
    assert torch.allclose(attend_soft(c, evicted, 2, 4, "dense"), streaming, atol=1e-6)


def test_distillation_kl_is_zero_for_the_teacher_and_the_definition_otherwise():
    teacher = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    assert distillation_kl(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)
    student = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    p, q = teacher.softmax(-1), student.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    assert distillation_kl(teacher, student).item() == pytest.approx(expected.item(), rel=1e-6)
