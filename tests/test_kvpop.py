"""KVpop: future-attention target, static priority, boundary loss, mLSTM readout, engine budget, checkpoints."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import save_file

from harness.config import compose_config, model_spec
from harness.decode import kv_cache
from harness.decode.engine import Engine, Request
from harness.training.kvpop.loss import (
    Decisions,
    Weighting,
    boundary_loss,
    cutoff_loss,
    decision_weights,
    sample_queries,
    teacher_decisions,
)
from harness.training.kvpop.target import future_attention_target
from methods.base import SequenceInfo
from methods.kvpop import CheckpointInfo, KVpop, build_scorer, effective_score, save_checkpoint, static_base
from methods.kvpop.ranking import candidates, static_priority
from methods.kvpop.recall import TeacherRecall, target_from_mass
from methods.kvpop.scorers import delayed
from methods.selection import Selection

GEOMETRY = {"layers": 3, "kv_heads": 2, "head_dim": 16}  # the tiny test models


def random_qk(length: int, heads: int = 4, kv_heads: int = 2, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(length)
    queries = torch.randn(heads, length, dim, generator=generator, dtype=torch.float64) * 2
    keys = torch.randn(kv_heads, length, dim, generator=generator, dtype=torch.float64) * 2
    return queries, keys


@pytest.mark.parametrize("method", ["chunked", "flex"])
def test_future_attention_target_matches_dense(method):
    queries, keys = random_qk(77)
    dense, valid = future_attention_target(queries, keys, 0.25, window=5, method="dense")
    if method == "flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
        queries, keys = queries.float(), keys.float()
    got, got_valid = future_attention_target(queries, keys, 0.25, window=5, method=method, block=16)
    assert torch.equal(valid, got_valid) and valid.sum() == 77 - 5
    assert torch.allclose(got.double(), dense, atol=1e-4 if method == "flex" else 1e-9)


def test_dense_target_is_the_definition():
    queries, keys = random_qk(12, heads=2, kv_heads=1)
    target, _ = future_attention_target(queries, keys, 0.5, window=3, eps=1e-6, method="dense")
    logits = (queries @ keys[0].T) * 0.5
    attention = logits.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -torch.inf).softmax(-1)
    t = 4  # queries d = 7..11 see token 4 after it left a window of 3
    mass = attention[:, 7:, t].sum(-1).max()
    assert target[0, t].item() == pytest.approx(math.log(1e-6 + mass.item() / 5))


@pytest.mark.parametrize("bucket", [1, 3])
def test_static_priority_keeps_the_same_set_as_the_dynamic_form(bucket):
    generator = torch.Generator().manual_seed(bucket)
    heads, length, sinks, window, budget = 3, 120, 2, 6, 20
    scores = torch.randn(heads, length, generator=generator, dtype=torch.float64)
    log_gamma = torch.tensor([[-0.2], [-0.05], [0.0]], dtype=torch.float64)
    selection = Selection(budget_tokens=budget, sinks=sinks, window=window, granularity="head")
    base = static_base(scores, torch.arange(length), log_gamma, bucket)
    dynamic = static = torch.arange(budget).expand(heads, -1)
    for query in range(budget, length):
        new = torch.full((heads, 1), query)
        dynamic, static = torch.cat([dynamic, new], 1), torch.cat([static, new], 1)
        ranked = effective_score(scores.gather(1, dynamic), dynamic, query, log_gamma, bucket)
        dynamic = dynamic.gather(1, selection.select(ranked, dynamic, query + 1, budget))
        ranked = static_priority(base.gather(1, static), static, query, log_gamma, bucket)
        static = static.gather(1, selection.select(ranked, static, query + 1, budget))
        assert torch.equal(dynamic, static), query


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_boundary_loss_is_eq7_on_the_newly_eligible_token_and_its_boundary():
    # One head, one query q = 5 with s = 0, w = 1: t_new = 4, eligible tokens 0..4, k = 2.
    teacher = torch.tensor([[[4.0, 3.0, 1.0, 0.0, 3.5, 9.0]]])
    student = torch.tensor([[[1.0, 2.0, 0.5, 3.0, -1.0, 7.0]]])
    queries = torch.tensor([5])
    mask = candidates(queries, 6, 0, 1)
    # displaced: the 2nd best of the others {0, 1, 2, 3} is token 1 (3.0); 3.5 > 3.0 keeps t_new (y = +1).
    decisions = teacher_decisions(teacher, mask, queries, 1, 2, "displaced")
    assert decisions.label.tolist() == [1.0] and decisions.new.tolist() == [4] and decisions.boundary.tolist() == [1]
    assert decisions.margin.tolist() == [0.5]
    tau = 0.5
    weight = 0.1 + 0.9 * sigmoid(0.5 / 1.0)  # Eq. 23; one decision: the balance weight normalises to 1
    loss = boundary_loss(student, teacher, mask, queries, 1, 2, tau, Weighting())
    assert loss.item() == pytest.approx(weight * softplus(-(-1.0 - 2.0) / tau), rel=1e-6)
    unweighted = Weighting(margin_min=None, balance=False)
    assert boundary_loss(student, teacher, mask, queries, 1, 2, tau, unweighted).item() == pytest.approx(
        softplus(3.0 / tau), rel=1e-6
    )
    # last_kept: the 2nd best of all eligible tokens is t_new itself, a zero-margin pair.
    literal = teacher_decisions(teacher, mask, queries, 1, 2, "last_kept")
    assert literal.label.tolist() == [1.0] and literal.boundary.tolist() == [4] and literal.margin.tolist() == [0.0]
    assert boundary_loss(student, teacher, mask, queries, 1, 2, tau, Weighting(), "last_kept").item() == (
        pytest.approx((0.1 + 0.9 * 0.5) * math.log(2), rel=1e-6)  # margin 0: sigmoid(0) = 1/2
    )
    # A dropped t_new: teacher 0.5 < 3.0, y = -1, margin 2.5, and the loss pushes z_new below z_bnd.
    teacher[0, 0, 4] = 0.5
    dropped = teacher_decisions(teacher, mask, queries, 1, 2, "displaced")
    assert dropped.label.tolist() == [-1.0] and dropped.margin.tolist() == [2.5]
    assert boundary_loss(student, teacher, mask, queries, 1, 2, tau, unweighted).item() == pytest.approx(
        softplus(-3.0 / tau), rel=1e-6
    )


def test_balance_weights_equalise_keep_and_drop_per_head():
    # Head 0: three keeps and one drop, rho_h = 3/4: raw weights 1/(2 * 3/4) = 2/3 and 1/(2 * 1/4) = 2, mean 1.
    label = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    head = torch.tensor([0, 0, 0, 0, 1, 1])
    decisions = Decisions(label, head * 0, head * 0, torch.zeros(6), head)
    weights = decision_weights(decisions, 2, Weighting(margin_min=None))
    raw = torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0, 1.0, 1.0])
    assert torch.allclose(weights, raw / raw.mean())
    clipped = decision_weights(decisions, 2, Weighting(margin_min=None, balance_min=0.9, balance_max=1.5))
    raw = torch.tensor([0.9, 0.9, 0.9, 1.5, 1.0, 1.0])
    assert torch.allclose(clipped, raw / raw.mean())


def test_cutoff_loss_hand_computed():
    # k = 2: teacher keeps {0, 1}; cutoffs: last kept = 1 (e=3), first dropped = 2 (e=1).
    teacher = torch.tensor([[4.0, 3.0, 1.0, 0.0, 9.0]])
    student = torch.tensor([[1.0, 2.0, 0.5, 3.0, -5.0]])
    mask = torch.tensor([[True, True, True, True, False]])  # the last token is no candidate
    tau, margin = 0.5, 2.0
    w = [1 - math.exp(-3 / margin), 1 - math.exp(-2 / margin), 1 - math.exp(-2 / margin), 1 - math.exp(-3 / margin)]
    keep = (w[0] * softplus(-(1.0 - 0.5) / tau) + w[1] * softplus(-(2.0 - 0.5) / tau)) / (w[0] + w[1])
    drop = (w[2] * softplus(-(2.0 - 0.5) / tau) + w[3] * softplus(-(2.0 - 3.0) / tau)) / (w[2] + w[3])
    loss = cutoff_loss(student, teacher, mask, k=2, temperature=tau, margin=margin)
    assert loss.item() == pytest.approx(0.5 * (keep + drop), rel=1e-6)
    assert loss.item() == pytest.approx(0.69452, abs=1e-4)
    unweighted = 0.25 * (softplus(-1) + softplus(-3) + softplus(-3) + softplus(2))
    assert cutoff_loss(student, teacher, mask, 2, tau, None).item() == pytest.approx(unweighted, rel=1e-6)
    # a row with no more candidates than k teaches nothing
    assert cutoff_loss(student, teacher, mask, k=4).item() == 0.0


def test_query_sampling_stays_after_saturation():
    queries = sample_queries(200, 150, 500, 0.5, torch.Generator().manual_seed(0))
    assert queries.min() >= 150 and queries.max() <= 199
    late = sample_queries(200, 0, 4000, 1.0, torch.Generator().manual_seed(0)).float().mean()
    assert late > 120  # the late-biased density 2x/200 has mean 133


@pytest.mark.parametrize(("delay", "readout"), [(0, "linear"), (5, "linear"), (5, "silu")])
def test_mlstm_incremental_readout_matches_the_sequence_form(delay, readout):
    torch.manual_seed(0)
    hyper = {"gamma_min": 0.9, "gamma_max": 1.0, "cell_dim": 4, "delay": delay, "readout": readout}
    scorer = build_scorer("mlstm", 1, 2, 8, **hyper, chunk=7)
    keys, values = torch.randn(2, 40, 8), torch.randn(2, 40, 8)
    with torch.no_grad():
        whole = scorer(keys, values, 0)
        one_chunk = build_scorer("mlstm", 1, 2, 8, **hyper, chunk=64)
        one_chunk.load_state_dict(scorer.state_dict())
        assert torch.allclose(one_chunk(keys, values, 0), whole, atol=1e-5)
        # The policy's order: a prompt, then one token per step, each read out with the token `delay` before it.
        read_keys, read_values = delayed(keys, delay), delayed(values, delay)
        readouts, state = scorer.step(keys[:, :13], values[:, :13], 0, None, read_keys[:, :13], read_values[:, :13])
        parts = [readouts]
        for t in range(13, 40):
            new = slice(t, t + 1)
            readout, state = scorer.step(keys[:, new], values[:, new], 0, state, read_keys[:, new], read_values[:, new])
            parts.append(readout)
    incremental = torch.cat(parts, 1)[:, delay:]
    assert torch.allclose(incremental, whole[:, : 40 - delay], atol=1e-5)
    assert state.matrix[0].numel() + state.normaliser[0].numel() + 1 == scorer.state_numel() == 4 * 8 + 8 + 1


def test_silu_readout_and_log_space_decay_are_the_papers_equations():
    scorer = build_scorer("mlstm", 1, 1, 4, gamma_min=0.9, gamma_max=0.99, gamma_space="log", cell_dim=2, delay=0,
                          readout="silu")  # fmt: skip
    with torch.no_grad():
        scorer.w_out.copy_(torch.tensor([[[1.0, -2.0]]]))
        scorer.b_out.fill_(0.5)
        scorer.gamma_logit.fill_(0.0)
    hidden = torch.tensor([[[[1.0, 3.0]]]])
    silu = lambda x: x * sigmoid(x)  # noqa: E731
    assert scorer.readout(hidden[0], 0).item() == pytest.approx(silu(1.0) - 2 * silu(3.0) + 0.5, rel=1e-6)  # Eq. 11
    # Eq. 21: sigmoid(0) = 1/2 halfway between log 0.9 and log 0.99, i.e. the geometric mean.
    assert scorer.log_gamma().item() == pytest.approx(0.5 * (math.log(0.9) + math.log(0.99)), rel=1e-6)
    with pytest.raises(ValueError, match=re.escape("0 < gamma_min < gamma_max < 1 for kvpop.gamma_space=log")):
        build_scorer("mlp", 1, 1, 4, gamma_min=0.99, gamma_max=1.0, gamma_space="log", hidden=4)


def tiny_checkpoint(path, kind: str = "mlstm", model: str = "tiny_llama", layers: int = 3) -> str:
    torch.manual_seed(1)
    hyper = {"cell_dim": 4, "delay": 8} if kind == "mlstm" else {"hidden": 8}
    scorer = build_scorer(kind, layers, 2, 16, gamma_min=0.999, gamma_max=1.0, **hyper)
    info = CheckpointInfo(
        model, layers, 2, 16, scorer.hyperparameters(), {"sinks": 2, "window": 8, "k": 30, "bucket": 1}
    )
    return str(save_checkpoint(scorer, path / f"{kind}.safetensors", info))


def kvpop_method(checkpoint: str, model: str, *overrides: str, method: str = "kvpop") -> KVpop:
    cfg = compose_config(f"method={method}", f"model={model}", f"method.checkpoint={checkpoint}", *overrides)
    return instantiate(cfg.method)


@pytest.mark.parametrize("kind", ["mlstm", "mlp"])
def test_per_head_budget_after_every_step_through_the_engine(tiny_models, tmp_path, kind):
    method = kvpop_method(
        tiny_checkpoint(tmp_path, kind), "tiny_llama", "rho=0.5", method=f"kvpop{'_mlp' * (kind == 'mlp')}"
    )
    steps = []
    engine = Engine(
        tiny_models["tiny_llama"],
        method,
        on_step=lambda step, context, cache: steps.append(
            (step, kv_cache.cache_lengths(cache), [p.clone() for p in context.positions])
        ),
    )
    prompt = torch.randint(0, 49152, (96,), generator=torch.Generator().manual_seed(3)).tolist()
    result = engine.generate(Request(prompt, 24))
    # B = 48 entries of 2 x 16 float32 numbers (128 bytes); the mLSTM state (4 x 8 + 8 + 1 numbers, 164 bytes
    # per head) costs ceil(164 / 128) = 2 of them, which k gives up (count_state).
    state_entries, state_bytes = (2, 3 * 2 * 164) if kind == "mlstm" else (0, 0)
    budget = 48 - state_entries
    assert result.budget == budget and result.state_bytes == state_bytes
    assert result.kv_bytes_final == 3 * 2 * budget * 128 + state_bytes
    decode = [s for s in steps if s[0] >= 1]
    assert len(decode) == 23
    differs = False
    for step, lengths, positions in decode:
        assert lengths == [budget] * 3, step
        seen = 96 + step
        for layer in positions:
            assert layer.shape == (2, budget)
            assert (layer[:, :2] == torch.arange(2)).all()  # sinks
            assert (layer[:, -8:] == torch.arange(seen - 8, seen)).all()  # recent window
            differs |= not torch.equal(layer[0], layer[1])
    assert differs, "per-head keep sets never differed"


def test_recall_and_eviction_pattern_reach_the_record(tiny_models, tmp_path):
    method = kvpop_method(
        tiny_checkpoint(tmp_path, "mlp"), "tiny_llama", "rho=0.5", "+method.recall_queries=4",
        "+method.pattern_tail=10", method="kvpop_mlp",
    )  # fmt: skip
    final = []
    engine = Engine(
        tiny_models["tiny_llama"], method, on_step=lambda step, context, cache: final.append(context.positions)
    )
    prompt = torch.randint(0, 49152, (96,), generator=torch.Generator().manual_seed(8)).tolist()
    report = engine.generate(Request(prompt, 12)).method_report
    recalls = [report[f"recall_l{layer}_h{head}"] for layer in range(3) for head in range(2)]
    assert all(0.0 <= value <= 1.0 for value in recalls)
    assert report["recall"] == pytest.approx(sum(recalls) / 6, abs=1e-4)
    seen = 96 + 12 - 1  # the last generated token is never fed back
    assert report["pattern_positions"] == list(range(seen - 8 - 10, seen - 8))
    kept = final[-1]
    assert report["pattern_heads"] == [
        [int((layer == position).any(-1).sum()) for position in report["pattern_positions"]] for layer in kept
    ]


def test_teacher_recall_mass_is_the_future_attention_target():
    queries, keys = random_qk(30)
    teacher = TeacherRecall(window=4)
    teacher.observe(0, queries[:, :20].float(), keys[:, :20].float(), 0.25)  # the prompt
    for position in range(20, 30):  # then one query and key per step
        teacher.observe(0, queries[:, position : position + 1].float(), keys[:, position : position + 1].float(), 0.25)
    got, valid = target_from_mass(teacher.mass[0], 4, 1e-6)
    expected, expected_valid = future_attention_target(queries, keys, 0.25, window=4, method="dense")
    assert torch.equal(valid, expected_valid) and torch.allclose(got.double(), expected, atol=1e-5)


def test_no_budget_means_identical_generation(tiny_models, tmp_path):
    model = tiny_models["tiny_llama"]
    prompt = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    model.set_attn_implementation("sdpa")
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    method = kvpop_method(tiny_checkpoint(tmp_path), "tiny_llama", "rho=0")
    assert Engine(model, method).generate(Request(prompt, 8)).tokens == reference[0, 40:].tolist()


def test_checkpoint_for_another_model_is_refused(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)
    # hydra wraps the ValueError of the constructor
    with pytest.raises(Exception, match=r"trained for tiny_llama \(3 layers.*used with model='tiny_qwen2' — "):
        kvpop_method(checkpoint, "tiny_qwen2")
    deeper = tiny_checkpoint(tmp_path / "deep", layers=4)
    info = SequenceInfo(prefill_len=64, num_layers=3, num_kv_heads=2, num_query_heads=4, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"4 layers.*3 layers"):
        KVpop(checkpoint=deeper, rho=0.5).begin(info)
    with pytest.raises(Exception, match="method.scorer_kind='mlp' but .* holds a mlstm scorer — "):
        kvpop_method(checkpoint, "tiny_llama", method="kvpop_mlp")


def test_scorer_only_recipe_writes_a_checkpoint_the_policy_loads(tmp_path, tiny_models):
    from harness.training.kvpop.train import train

    cfg = compose_config(
        "model=tiny_llama",
        "kvpop_recipe=scorer_only",
        "kvpop.sinks=2",
        "kvpop.window=8",
        "kvpop.k=16",
        "kvpop.cell_dim=4",
        "data.length=96",
        "data.windows=2",
        "data.skip=0",
        "train.steps=4",
        "train.log_every=2",
        f"output={tmp_path}/scorer_only",
        config_name="train_kvpop",
    )
    summary = train(cfg)
    assert [point["step"] for point in summary["history"]] == [2, 4]
    method = kvpop_method(summary["policy"], "tiny_llama", "rho=0.5")
    assert method.trained.policy == {"sinks": 2, "window": 8, "k": 16, "bucket": 1, "budget": 132}
    assert method.trained.base_model is None and method.trained.objective == "kvpop"
    # the variant keeps the earlier architecture: linear decay range to 1, linear readout, width 16 overridden to 4
    assert method.net.hyperparameters() | {"chunk": 64} == {
        "kind": "mlstm", "gamma_min": 0.99, "gamma_max": 1.0, "gamma_space": "linear", "cell_dim": 4, "delay": 8,
        "chunk": 64, "readout": "linear",
    }  # fmt: skip
    assert OmegaConf.create(method.trained.train["config"]).kvpop.k == 16
    assert model_spec("tiny_llama").name == method.trained.model


def test_hub_documents_need_a_pinned_revision_and_read_local_copies(tmp_path):
    from harness.training.kvpop.data import documents

    with pytest.raises(ValueError, match="has no revision — pin a commit"):
        documents(None, {"path": "open-r1/OpenR1-Math-220k", "column": "solution"})
    rows = tmp_path / "traces.jsonl"
    rows.write_text('{"solution": "first trace"}\n{"solution": "  "}\n{"solution": "second trace"}\n')
    docs = documents(None, {"path": "any", "column": "solution", "data_files": str(rows)})
    assert docs == ["first trace", "second trace"]


def test_unreadable_checkpoints_say_what_to_pass(tmp_path):
    missing = tmp_path / "x.safetensors"
    train = (
        "train one with python -m harness.training.kvpop model=<model> and pass method.checkpoint=<path>.safetensors"
    )
    with pytest.raises(FileNotFoundError, match=re.escape(f"KVpop checkpoint '{missing}' does not exist — {train}")):
        KVpop(checkpoint=str(missing))
    text = tmp_path / "text.safetensors"
    text.write_text("not a checkpoint, just text\n")
    good = tiny_checkpoint(tmp_path)
    truncated = tmp_path / "truncated.safetensors"
    data = Path(good).read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    for path in (text, truncated):
        with pytest.raises(ValueError, match=re.escape(f"{path} is not a safetensors file (")) as raised:
            KVpop(checkpoint=str(path))
        assert_one_line(str(raised.value))
        assert str(raised.value).endswith("— pass a checkpoint written by python -m harness.training.kvpop")
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(
        ValueError, match=re.escape(f"{plain} is a safetensors file without KVpop metadata — ")
    ) as raised:
        KVpop(checkpoint=str(plain))
    assert_one_line(str(raised.value))


def test_checkpoint_for_another_model_or_geometry_is_one_line(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "was trained for tiny_llama (3 layers, 2 KV heads, head_dim 16) but is used with model='tiny_qwen2' "
            "— train one for tiny_qwen2"
        ),
    ) as raised:
        KVpop(checkpoint=checkpoint, model="tiny_qwen2")
    assert_one_line(str(raised.value))
    info = SequenceInfo(prefill_len=64, num_layers=4, num_kv_heads=2, num_query_heads=4, max_new_tokens=4)
    with pytest.raises(
        ValueError, match=re.escape("but is used with a model of 4 layers, 2 KV heads — train one")
    ) as raised:
        KVpop(checkpoint=checkpoint, rho=0.5).begin(info)
    assert_one_line(str(raised.value))


def test_budget_hint_follows_where_the_budget_comes_from(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path)  # s=2, w=8
    info = SequenceInfo(prefill_len=64, num_layers=3, num_kv_heads=2, num_query_heads=4, max_new_tokens=4)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "KVpop budget B=6 (rho=0.9 of L0=64 prompt tokens) is smaller than sinks+window=2+8=10 "
            "— lower rho or use longer prompts"
        ),
    ) as raised:
        KVpop(checkpoint=checkpoint, rho=0.9).begin(info)
    assert_one_line(str(raised.value))
    with pytest.raises(
        ValueError,
        match=re.escape("method.k=0 is not a number >= 1 of older tokens kept beyond sinks+window — raise method.k"),
    ) as raised:
        KVpop(checkpoint=checkpoint, rho=0.9, k=0)
    assert_one_line(str(raised.value))
    assert "lower rho" not in str(raised.value)
    fixed = KVpop(checkpoint=checkpoint, rho=0.9, k=1)
    fixed.begin(info)
    assert fixed.budget() == 2 + 8 + 1


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"checkpoint": None}, "method.checkpoint=None is not a checkpoint path — train one with"),
        ({"scorer_kind": "lstm"}, "method.scorer_kind='lstm' is not a KVpop scorer — use one of mlp, mlstm"),
        ({"rho": "abc"}, "rho='abc' is not a number — "),
        ({"k": "abc"}, "method.k='abc' is not a number >= 1 of older tokens kept beyond sinks+window — "),
        ({"sinks": -1}, "method.sinks=-1 must be an integer >= 0 — use e.g. method.sinks=4"),
        ({"window": "w"}, "method.window='w' must be an integer >= 0 — "),
        ({"bucket": 0}, "method.bucket=0 must be an integer >= 1 — "),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        KVpop(**{"checkpoint": "never_loaded.safetensors", **options})
    assert_one_line(str(raised.value))


@pytest.mark.parametrize(
    ("kind", "hyper", "named"),
    [
        ("lstm", {}, "kvpop.scorer='lstm' is not a KVpop scorer — use one of mlp, mlstm"),
        ("mlp", {"gamma_min": "x", "hidden": 8}, "kvpop.gamma_min='x' and kvpop.gamma_max=1.0 must be numbers"),
        ("mlp", {"gamma_min": 0.5, "gamma_max": 1.5, "hidden": 8}, "kvpop.gamma_min=0.5 and kvpop.gamma_max=1.5"),
        ("mlp", {"hidden": 0}, "kvpop.hidden=0 must be an integer >= 1 — use e.g. kvpop.hidden=32"),
        ("mlstm", {"cell_dim": 4, "delay": -1}, "kvpop.window=-1, the mLSTM readout delay, must be an integer >= 0 — "),
        ("mlstm", {"cell_dim": "4", "delay": 8}, "kvpop.cell_dim='4' must be an integer >= 1 — "),
        ("mlstm", {"cell_dim": 4, "delay": 8, "chunk": 0}, "kvpop.chunk=0 must be an integer >= 1 — "),
    ],
)
def test_bad_scorer_parameters_name_the_training_option(kind: str, hyper: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)) as raised:
        build_scorer(kind, 1, 2, 8, **{"gamma_min": 0.9, "gamma_max": 1.0, **hyper})
    assert_one_line(str(raised.value))
