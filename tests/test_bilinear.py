"""The learned bilinear scorer: its head and loss on hand-computed values, its checkpoint (refused on another
model), and the training entry end to end on a tiny model, whose checkpoint then drives method=bilinear."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import named_method, refused
from safetensors.torch import save_file

from harness.decode.engine import Engine, Request
from harness.errors import UserError, user_errors
from harness.training.bilinear.loss import agreement, causal_mask, distillation_loss, teacher_attention
from methods.base import LayerView, SequenceInfo
from methods.scorers.bilinear import BilinearHead, BilinearInfo, BilinearScorer, flat_keys, flat_queries, save_bilinear

ROOT = Path(__file__).resolve().parents[1]


def test_the_head_is_a_scaled_bilinear_form():
    head = BilinearHead(1, query_dim=2, key_dim=2, rank=4)
    with torch.no_grad():
        head.query.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]]))
        head.key.copy_(torch.tensor([[[2.0, 0.0], [0.0, 0.0], [1.0, -1.0], [0.0, 3.0]]]))
    queries = torch.tensor([[1.0, 2.0]])
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # W_q q = (1, 2, 3, 0); W_k k = (2, 0, 1, 0) and (0, 0, -1, 3): dots 5 and -3, over sqrt(4).
    torch.testing.assert_close(head.logits(queries, keys, layer=7), torch.tensor([[2.5, -1.5]]))
    assert sum(p.numel() for p in BilinearHead(1, 4096, 1024).parameters()) == 327_680  # the paper's, on Llama-3.1-8B


def test_heads_and_entries_are_concatenated_in_head_order():
    queries = torch.arange(12.0).view(2, 3, 2)  # (heads, Q, D)
    assert flat_queries(queries)[1].tolist() == [2.0, 3.0, 8.0, 9.0]
    keys = torch.arange(8.0).view(2, 2, 2)  # (kv_heads, T, D)
    assert flat_keys(keys)[0].tolist() == [0.0, 1.0, 4.0, 5.0]


def test_loss_is_mse_plus_weighted_kl():
    logits = torch.tensor([[0.0, math.log(3.0), 5.0]])
    teacher = torch.tensor([[0.5, 0.5, 0.0]])
    visible = torch.tensor([[True, True, False]])
    # Student over the two visible entries: (1/4, 3/4). MSE summed: 2 * (1/4)^2; KL(teacher || student).
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    expected = 2 * 0.0625 + 0.1 * kl
    assert distillation_loss(logits, teacher, visible, kl_weight=0.1, tau=1.0).item() == pytest.approx(expected)
    # tau = 2 halves the logits: student (1/(1+sqrt 3), sqrt 3/(1+sqrt 3)).
    low = 1 / (1 + math.sqrt(3))
    expected = 2 * (0.5 - low) ** 2 + 0.1 * (0.5 * math.log(0.5 / low) + 0.5 * math.log(0.5 / (1 - low)))
    assert distillation_loss(logits, teacher, visible, kl_weight=0.1, tau=2.0).item() == pytest.approx(expected)


def test_teacher_is_the_causal_attention_averaged_over_query_heads():
    keys = torch.eye(3)[None]  # one KV head, entries e_0, e_1, e_2
    queries = torch.zeros(2, 3, 3)
    queries[0, 2, 0] = math.log(2.0)  # head 0, row 2 prefers entry 0
    queries[1, 2, 2] = math.log(3.0)  # head 1, row 2 prefers entry 2
    teacher = teacher_attention(queries, keys, torch.tensor([1, 2]), scaling=1.0)
    torch.testing.assert_close(teacher[0], torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(teacher[1], (torch.tensor([0.5, 0.25, 0.25]) + torch.tensor([0.2, 0.2, 0.6])) / 2)
    assert causal_mask(torch.tensor([0]), 3).tolist() == [[True, False, False]]


def test_agreement_is_spearman_and_top_fraction_jaccard():
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert agreement(scores, scores.flip(0), 0.4) == (pytest.approx(-1.0), 0.0)
    spearman, jaccard = agreement(scores, torch.tensor([4.0, 2.0, 3.0, 1.0, 0.0]), 0.4)
    assert spearman == pytest.approx(0.9) and jaccard == pytest.approx(1 / 3)


def write_head(path: Path, model: str = "tiny_llama", layers: int = 3) -> Path:
    torch.manual_seed(0)
    info = BilinearInfo(model, layers, 4, 2, 16, 8, per_layer=False)
    save_bilinear(BilinearHead(1, 4 * 16, 2 * 16, 8), str(path), info)
    return path


def scorer(*overrides: str) -> object:
    with user_errors():
        return named_method("bilinear", *overrides)


def test_checkpoints_are_refused_on_another_model_or_file(tmp_path):
    head = write_head(tmp_path / "head.safetensors")
    message = refused(lambda: scorer("model=tiny_qwen2", f"method.scorer.checkpoint={head}"), "tiny_qwen2", UserError)
    assert "trained for tiny_llama" in message and "harness.training.bilinear model=tiny_qwen2" in message
    missing = tmp_path / "none.safetensors"
    refused(lambda: scorer("model=tiny_llama", f"method.scorer.checkpoint={missing}"), "does not exist", UserError)
    text = tmp_path / "text.safetensors"
    text.write_text("not a checkpoint\n")
    refused(lambda: scorer(f"method.scorer.checkpoint={text}"), "is not a safetensors file", UserError)
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    refused(lambda: scorer(f"method.scorer.checkpoint={plain}"), "without bilinear metadata", UserError)
    # Same name, other geometry (a preset edited since): refused when the sequence starts.
    reshaped = write_head(tmp_path / "reshaped.safetensors", layers=5)
    method = scorer("model=tiny_llama", f"method.scorer.checkpoint={reshaped}")
    refused(lambda: method.begin(SequenceInfo(96, 3, 2, 4, 4)), "5 layers")


def test_scores_are_the_heads_softmax_for_every_kv_head(tmp_path):
    chosen = BilinearScorer(str(write_head(tmp_path / "head.safetensors")), "tiny_llama")
    chosen.begin(SequenceInfo(5, 3, 2, 4, 4))
    generator = torch.Generator().manual_seed(1)
    keys, queries = torch.randn(2, 5, 16, generator=generator), torch.randn(4, 1, 16, generator=generator)
    scores = chosen.score(LayerView(1, keys, keys, torch.arange(5).expand(2, -1), queries=queries))
    expected = chosen.head.logits(flat_queries(queries), flat_keys(keys), 1).softmax(dim=-1)
    torch.testing.assert_close(scores, expected.expand(2, -1))


def test_training_entry_writes_a_checkpoint_method_bilinear_runs(tmp_path, tiny_models):
    output = tmp_path / "tiny.safetensors"
    command = [
        sys.executable, "-m", "harness.training.bilinear", "model=tiny_llama", "train.steps=6", "train.log_every=3",
        "data.length=64", "data.windows=2", "data.held_out=1", f"output={output}", f"results_dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["final"]["step"] == 6 and summary["held_out"]["layer"] == 2
    meta = json.loads(output.with_suffix(".json").read_text())
    assert meta["model"] == "tiny_llama" and meta["train"]["parameters"] == 64 * (4 * 16 + 2 * 16)
    assert [point["step"] for point in meta["train"]["history"]] == [3, 6]
    method = named_method("bilinear", "rho=0.5", "model=tiny_llama", f"method.scorer.checkpoint={output}")
    result = Engine(tiny_models["tiny_llama"], method).generate(Request(list(range(100, 196)), 6))
    assert result.cache_len_final == 48
