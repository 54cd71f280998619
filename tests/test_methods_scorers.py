"""Scorers on hand-made tensors: each per-step signal against its closed form."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import named_method, refused
from torch import Tensor

from methods.base import LayerView, SequenceInfo
from methods.scorers.attention import AttentionScorer
from methods.scorers.base import FLAGS, NormScorer, Scorer
from methods.scorers.bilinear import BilinearHead, BilinearInfo, BilinearScorer, save_bilinear
from methods.scorers.entropy import EntropyScorer
from methods.scorers.expected_attention import ExpectedAttentionScorer
from methods.scorers.keydiff import KeyDiffScorer
from methods.scorers.keynorm import KeyNormScorer
from methods.scorers.random_uniform import RandomScorer
from methods.scorers.recency import RecencyScorer
from methods.scorers.vnorm import VNormScorer


def view(
    weights: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> LayerView:
    """A view whose unspecified tensors are consistent ones/aranges of the given geometry."""
    if weights is not None:
        kv_heads, length = weights.shape[0], weights.shape[-1]
    elif positions is not None:
        kv_heads, length = positions.shape
    else:
        source = keys if keys is not None else values
        kv_heads, length = source.shape[:2]
    if positions is None:
        positions = torch.arange(length).expand(kv_heads, -1)
    if keys is None:
        keys = torch.ones(kv_heads, length, 2)
    if values is None:
        values = torch.ones(kv_heads, length, 2)
    return LayerView(layer=0, keys=keys, values=values, positions=positions, weights=weights)


def info(seed: int = 0) -> SequenceInfo:
    return SequenceInfo(prefill_len=4, num_layers=1, num_kv_heads=2, num_query_heads=4, max_new_tokens=4, seed=seed)


def test_needs_attention_flags() -> None:
    assert AttentionScorer.needs_attention is True
    assert VNormScorer.needs_attention is True
    assert EntropyScorer.needs_attention is True
    assert KeyNormScorer.needs_attention is False
    assert KeyDiffScorer.needs_attention is False
    assert RecencyScorer.needs_attention is False
    assert RandomScorer.needs_attention is False
    assert RandomScorer().needs_attention is False


def test_order_free_flags() -> None:
    # EntryNorms and the random draws read the cache's order; the rest score entries by what they hold.
    for scorer in (KeyNormScorer, KeyDiffScorer, VNormScorer, RandomScorer):
        assert scorer.order_free is False, scorer
    for scorer in (AttentionScorer, EntropyScorer, RecencyScorer, BilinearScorer, ExpectedAttentionScorer):
        assert scorer.order_free is True, scorer


def test_a_scorer_that_does_not_declare_a_flag_is_refused_by_name() -> None:
    @dataclass
    class Undeclared(Scorer):
        needs_attention = False

        def score(self, view: LayerView) -> Tensor:
            return view.positions.float()

    @dataclass
    class NoAttentionFlag(NormScorer):  # order_free comes from NormScorer, between it and Scorer
        def score(self, view: LayerView) -> Tensor:
            return -self.norms(view, view.keys)

    message = refused(Undeclared, "scorer Undeclared does not declare order_free")
    assert "set order_free = True if" in message and FLAGS["order_free"] in message
    message = refused(NoAttentionFlag, "scorer NoAttentionFlag does not declare needs_attention")
    assert "set needs_attention = True if" in message

    @dataclass
    class Declared(NoAttentionFlag):
        needs_attention = False

    assert Declared().order_free is False and Declared().needs_attention is False


SCORER_CONF = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "conf/method/scorer").glob("*.yaml"))


@pytest.mark.parametrize("name", SCORER_CONF)
def test_every_scorer_conf_instantiates_through_hydra(name: str, tmp_path: Path) -> None:
    overrides = [f"method/scorer={name}"]
    if name == "bilinear":
        head = tmp_path / "head.safetensors"
        save_bilinear(BilinearHead(1, 4 * 16, 2 * 16, 8), str(head), BilinearInfo("tiny_llama", 3, 4, 2, 16, 8, False))
        overrides += ["model=tiny_llama", f"method.scorer.checkpoint={head}"]
    scorer = named_method("inertia", *overrides).scorer
    assert isinstance(scorer, Scorer)
    assert {flag: type(getattr(scorer, flag)) for flag in FLAGS} == {flag: bool for flag in FLAGS}


def test_attention_is_the_mean_over_the_query_group() -> None:
    weights = torch.tensor(
        [
            [[0.1, 0.2, 0.3, 0.4], [0.3, 0.2, 0.1, 0.4], [0.2, 0.2, 0.2, 0.4]],
            [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.5, 0.0, 0.5, 0.0]],
        ]
    )
    expected = torch.tensor([[0.2, 0.2, 0.2, 0.4], [1.5 / 3, 0.0, 0.5 / 3, 1.0 / 3]])
    torch.testing.assert_close(AttentionScorer().score(view(weights=weights)), expected)


def test_attention_scorers_reject_a_view_without_weights() -> None:
    keys = torch.ones(1, 3, 2)
    for scorer in (AttentionScorer(), VNormScorer(), EntropyScorer()):
        with pytest.raises(ValueError, match="attention"):
            scorer.score(view(keys=keys))


def test_vnorm_scales_attention_by_mean_normalised_value_norm() -> None:
    weights = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.3, 0.2, 0.1, 0.0]]])  # group mean .2 .2 .2 .2
    values = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0], [0.0, 0.0]]])  # norms 5 1 2 0, mean 2
    expected = torch.tensor([[0.2 * 5 / 2, 0.2 * 1 / 2, 0.2 * 2 / 2, 0.0]])
    torch.testing.assert_close(VNormScorer().score(view(weights=weights, values=values)), expected)


def test_vnorm_normalises_per_kv_head() -> None:
    weights = torch.full((2, 1, 2), 0.5)
    values = torch.tensor([[[1.0], [3.0]], [[10.0], [30.0]]])  # same ratios, 10x scale on head 1
    expected = torch.tensor([[0.25, 0.75], [0.25, 0.75]])
    torch.testing.assert_close(VNormScorer().score(view(weights=weights, values=values)), expected)


def test_keynorm_is_minus_the_key_norm() -> None:
    keys = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [6.0, 8.0], [-1.0, 0.0]]])
    expected = torch.tensor([[-5.0, -1.0, -2.0], [0.0, -10.0, -1.0]])
    torch.testing.assert_close(KeyNormScorer().score(view(keys=keys)), expected)


def test_keydiff_is_minus_cosine_to_the_mean_normalised_key() -> None:
    # Unit keys e1, e2 and the diagonal: the mean of the normalised keys points along the diagonal.
    # (kvpress convention: anchor = mean of the normalised keys, so key magnitudes do not steer it.)
    keys = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]])
    inv_sqrt2 = 1 / math.sqrt(2)
    expected = torch.tensor([[-inv_sqrt2, -inv_sqrt2, -1.0]])
    torch.testing.assert_close(KeyDiffScorer().score(view(keys=keys)), expected)


def test_keydiff_ranks_the_outlier_key_highest_per_head() -> None:
    keys = torch.tensor(
        [
            [[1.0, 0.1], [1.0, -0.1], [1.0, 0.0], [-1.0, 1.0]],
            [[0.0, 1.0], [-1.0, 0.0], [0.1, 1.0], [-0.1, 1.0]],
        ]
    )
    scores = KeyDiffScorer().score(view(keys=keys))
    assert scores.argmax(dim=-1).tolist() == [3, 1]


def test_recency_is_the_absolute_position() -> None:
    positions = torch.tensor([[0, 1, 7, 42], [0, 3, 8, 42]])
    scores = RecencyScorer().score(view(positions=positions))
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, positions.float())


def test_random_is_reproducible_for_a_seed_and_differs_across_seeds() -> None:
    positions = torch.arange(16).expand(2, -1)

    def draws(seed: int) -> list[torch.Tensor]:
        scorer = RandomScorer()
        scorer.begin(info(seed))
        return [scorer.score(view(positions=positions)) for _ in range(3)]

    first, again, other = draws(0), draws(0), draws(1)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not any(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert not torch.equal(first[0], first[1])  # fresh draws per step
    assert first[0].shape == (2, 16)
    assert bool(((first[0] >= 0) & (first[0] < 1)).all())


def test_random_begin_resets_the_stream() -> None:
    positions = torch.arange(8)[None]
    scorer = RandomScorer()
    scorer.begin(info(5))
    first = scorer.score(view(positions=positions))
    scorer.score(view(positions=positions))
    scorer.begin(info(5))
    assert torch.equal(scorer.score(view(positions=positions)), first)


def test_entropy_uniform_attention_scores_zero() -> None:
    weights = torch.full((2, 3, 8), 1 / 8)
    torch.testing.assert_close(EntropyScorer().score(view(weights=weights)), torch.zeros(2, 8))


def test_entropy_one_hot_attention_is_unchanged() -> None:
    weights = torch.zeros(2, 2, 5)
    weights[0, :, 3] = 1.0
    weights[1, :, 0] = 1.0
    expected = weights.mean(dim=1)
    torch.testing.assert_close(EntropyScorer().score(view(weights=weights)), expected)


def test_entropy_is_one_scalar_per_layer_averaged_over_heads() -> None:
    # Head 0 uniform (H = log 4), head 1 one-hot (H = 0): mean H = log(4)/2, factor 1/2 for both heads.
    weights = torch.zeros(2, 1, 4)
    weights[0] = 0.25
    weights[1, 0, 2] = 1.0
    expected = 0.5 * weights.mean(dim=1)
    torch.testing.assert_close(EntropyScorer().score(view(weights=weights)), expected)


def test_entropy_single_entry_is_the_attention() -> None:
    weights = torch.ones(1, 2, 1)
    torch.testing.assert_close(EntropyScorer().score(view(weights=weights)), torch.ones(1, 1))
