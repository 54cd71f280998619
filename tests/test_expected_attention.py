"""Expected Attention and the RoPE maths under it, against hand-computed values and transformers' own RoPE.

The hand case has head_dim 2 (one frequency, a plain 2-D rotation) and frequency pi/2, so the
rotation at position p turns by p quarter turns and every number below is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from methods.base import LayerView, SequenceInfo
from methods.rope import mean_rotation, unrotate
from methods.scorers.expected_attention import ExpectedAttentionScorer, QueryStatistics

QUARTER = torch.tensor([math.pi / 2])


def rotation(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)


def info(prefill_len: int, inv_freq: torch.Tensor = QUARTER) -> SequenceInfo:
    return SequenceInfo(prefill_len, 1, 1, 1, 4, rope_inv_freq=inv_freq)


def test_unrotate_undoes_transformers_rope(tiny_models):
    rotary = tiny_models["tiny_llama"].model.rotary_emb
    generator = torch.Generator().manual_seed(0)
    pre = torch.randn(1, 2, 5, 16, generator=generator)
    positions = torch.tensor([[0, 3, 7, 100, 4000]])
    cos, sin = rotary(pre, positions)
    post, _ = apply_rotary_pos_emb(pre, pre, cos, sin)
    back = unrotate(post[0], positions[0], rotary.inv_freq, rotary.attention_scaling)
    # transformers takes the angles in float32 (off by ~1e-4 rad at position 4000), unrotate in float64.
    torch.testing.assert_close(back.float(), pre[0], rtol=1e-3, atol=1e-4)


def test_mean_rotation_is_the_average_of_the_rotations(tiny_models):
    rotary = tiny_models["tiny_llama"].model.rotary_emb
    positions = torch.arange(50, 58)
    basis = torch.eye(16)[None, None].expand(1, 1, 16, 16).reshape(1, 1, 16, 16)
    matrices = []
    for position in positions:
        cos, sin = rotary(basis, torch.full((1, 16), int(position)))
        rotated, _ = apply_rotary_pos_emb(basis, basis, cos, sin)
        matrices.append(rotated[0, 0].T.double())  # columns: the rotated basis vectors
    expected = torch.stack(matrices).mean(dim=0)
    torch.testing.assert_close(mean_rotation(positions, rotary.inv_freq, 1.0), expected, rtol=1e-6, atol=1e-6)
    # Hand case: positions 4 and 5 turn by 2 pi and 2.5 pi.
    torch.testing.assert_close(
        mean_rotation(torch.tensor([4, 5]), QUARTER, 1.0), (rotation(0) + rotation(math.pi / 2)) / 2
    )


def test_query_statistics_accumulate_moments():
    statistics = QueryStatistics.empty(1, 2, torch.device("cpu"))
    statistics.add(torch.tensor([[[1.0, 0.0], [1.0, 2.0]]], dtype=torch.float64))
    statistics.add(torch.tensor([[[3.0, 0.0], [3.0, 2.0]]], dtype=torch.float64))
    torch.testing.assert_close(statistics.mean(), torch.tensor([[2.0, 1.0]], dtype=torch.float64))
    # Deviations (+-1, +-1) with no correlation: biased covariance diag(1, 1).
    torch.testing.assert_close(statistics.covariance(), torch.eye(2, dtype=torch.float64)[None])


def hand_view(sinks_query: bool = False) -> LayerView:
    """Four prompt queries whose pre-RoPE forms are (1,0), (1,0), (3,0), (3,0), rotated to positions 0..3."""
    pre = [(1.0, 0.0), (1.0, 0.0), (3.0, 0.0), (3.0, 0.0)]
    queries = torch.stack([rotation(p * math.pi / 2) @ torch.tensor(q, dtype=torch.float64) for p, q in enumerate(pre)])
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    values = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    return LayerView(0, keys[None], values[None], torch.arange(4)[None], queries=queries.float()[None], scaling=1.0)


def test_expected_attention_matches_the_hand_computed_scores():
    scorer = ExpectedAttentionScorer(future=2, sinks=0)
    scorer.begin(info(4))
    scores = scorer.score(hand_view())
    # mu = (2, 0), Sigma = diag(1, 0); the future positions 4, 5 average to R = [[.5, -.5], [.5, .5]]:
    # mu' = (1, 1), Sigma' = [[.25, .25], [.25, .25]]. Logits mu'.k + k^T Sigma' k / 2:
    logits = torch.tensor([1.0 + 0.125, 1.0 + 0.125, 2.0 + 0.5, 0.0])
    norms = torch.tensor([5.0, 1.0, 2.0, 1.0])
    torch.testing.assert_close(scores[0], logits.softmax(dim=0) * norms)


def test_expected_attention_options_change_the_formula_as_documented():
    view = hand_view()
    plain = ExpectedAttentionScorer(future=2, sinks=0, covariance=False, value_norm=False)
    plain.begin(info(4))
    torch.testing.assert_close(plain.score(view)[0], torch.tensor([1.0, 1.0, 2.0, 0.0]).softmax(dim=0))
    # Sinks: entry 0 leaves the softmax (scored 0) and query 0 the statistics: mu = (7/3, 0),
    # Sigma = diag(8/9, 0) (deviations -4/3, 2/3, 2/3).
    sunk = ExpectedAttentionScorer(future=2, sinks=1, value_norm=False)
    sunk.begin(info(4))
    mean = torch.tensor([7 / 6, 7 / 6])
    spread = 8 / 9 / 4
    keys = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    logits = keys @ mean + 0.5 * spread * keys.sum(dim=1) ** 2
    expected = torch.cat([torch.zeros(1), logits.softmax(dim=0)])
    torch.testing.assert_close(sunk.score(view)[0], expected)


def test_expected_attention_statistics_grow_with_decode_queries():
    scorer = ExpectedAttentionScorer(future=2, sinks=0, value_norm=False)
    scorer.begin(info(4))
    prompt = hand_view()
    scorer.score(prompt)
    # A decode query at position 4 whose pre-RoPE form is (2, 0) leaves the mean at (2, 0) and the
    # variance at 4/5; its future is positions 5, 6: R = (rot(pi/2) + rot(pi)) / 2 = [[-.5, -.5], [.5, -.5]].
    query = (rotation(4 * math.pi / 2) @ torch.tensor([2.0, 0.0], dtype=torch.float64)).float()
    keys = torch.cat([prompt.keys[0], torch.tensor([[1.0, -1.0]])])
    view = LayerView(0, keys[None], keys[None], torch.arange(5)[None], queries=query[None, None], scaling=1.0)
    mean = torch.tensor([-1.0, 1.0])
    column = torch.tensor([-0.5, 0.5])
    spread = (keys @ column) ** 2 * 0.8
    torch.testing.assert_close(scorer.score(view)[0], (keys @ mean + 0.5 * spread).softmax(dim=0))


def test_expected_attention_scores_ragged_layers_head_by_head():
    scorer = ExpectedAttentionScorer(future=2, sinks=0)
    scorer.begin(SequenceInfo(4, 1, 2, 2, 4, rope_inv_freq=QUARTER))
    view = hand_view()
    both = LayerView(
        0,
        (view.keys[0], view.keys[0, 1:]),
        (view.values[0], view.values[0, 1:]),
        (torch.arange(4), torch.arange(1, 4)),
        queries=view.queries.expand(2, -1, -1).clone(),
        scaling=1.0,
    )
    first, second = scorer.score(both)
    logits = torch.tensor([1.125, 1.125, 2.5, 0.0])
    norms = torch.tensor([5.0, 1.0, 2.0, 1.0])
    torch.testing.assert_close(first, logits.softmax(dim=0) * norms)
    torch.testing.assert_close(second, logits[1:].softmax(dim=0) * norms[1:])


def test_expected_attention_needs_the_model_rope():
    scorer = ExpectedAttentionScorer()
    scorer.begin(SequenceInfo(4, 1, 1, 1, 4))
    with pytest.raises(ValueError, match="gives no RoPE frequencies — "):
        scorer.score(hand_view())
