"""The synthetic dialog world (FD-KVC paper): construction, metrics, and methods driven through it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import refused
from hydra.utils import instantiate

from harness.config import compose_config
from harness.world import MethodPolicy
from methods.fdkvc import FDKVC
from methods.full import FullCache
from methods.selection import Selection
from tasks.base import TaskProtocol
from tasks.dialogs import SCENARIOS, DialogTask, WorldConfig
from tasks.dialogs.simulate import adaptation
from tasks.dialogs.world import gram_schmidt, make_dialogs, projections

WORLD_METHODS = ("fifo", "sink_window", "h2o", "tova", "inertia", "cumulative", "fdkvc")


def world_method(name: str) -> MethodPolicy:
    return MethodPolicy(instantiate(compose_config(f"method={name}", "rho=0").method))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The world's tensors are small: extra threads only contend (the benchmark runs on one core).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task() -> DialogTask:
    return DialogTask(n_dialogs=4)


def test_topics_are_orthonormal_to_1e6():
    raw = torch.randn(50, 5, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    basis = gram_schmidt(raw)
    gram = basis @ basis.transpose(-1, -2)
    assert torch.allclose(gram, torch.eye(5, dtype=torch.float64).expand_as(gram), atol=1e-6)
    dialogs = make_dialogs(WorldConfig(), SCENARIOS["complex"], [0, 1, 2])
    gram = dialogs.topics @ dialogs.topics.transpose(-1, -2)
    assert (gram - torch.eye(5, dtype=torch.float64)).abs().max() < 1e-6


def test_scenarios_match_the_paper():
    turns = {name: s.n_turns for name, s in SCENARIOS.items()}
    assert turns == {"topic_shift": 10, "topic_return": 10, "mixed": 12, "complex": 20, "gradual": 12}
    assert SCENARIOS["topic_shift"].turn_labels() == [0] * 5 + [1] * 5
    assert SCENARIOS["topic_return"].turn_labels() == [0] * 3 + [1] * 4 + [0] * 3
    assert SCENARIOS["mixed"].turn_labels() == [0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 1, 1]
    assert SCENARIOS["complex"].turn_labels() == [k for k in range(5) for _ in range(4)]
    # Gradual: turn 1 pure A, B's weight grows over turns 2..8 (1-based) and is 1 from turn 8.
    shares = [weights[1] for weights in SCENARIOS["gradual"].mixtures]
    assert shares[0] == 0.0 and shares[7:] == [1.0] * 5
    assert shares[1:8] == pytest.approx([k / 7 for k in range(1, 8)])
    assert SCENARIOS["complex"].shifts() == [4, 8, 12, 16]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dialog_shapes(name):
    scenario = SCENARIOS[name]
    dialogs = make_dialogs(WorldConfig(), scenario, [0, 1, 2])
    length = scenario.n_turns * 32
    assert dialogs.x.shape == (3, length, 64) and dialogs.x.dtype == torch.float32
    assert dialogs.topics.shape == (3, scenario.n_topics, 64)
    assert dialogs.directions.shape == (3, scenario.n_turns, 64)
    assert torch.allclose(dialogs.directions.norm(dim=-1), torch.ones(3, scenario.n_turns, dtype=torch.float64))
    assert dialogs.labels.shape == (3, length)
    heads = projections(WorldConfig())
    for matrix in (heads.w_q, heads.w_k, heads.w_v):
        assert matrix.shape == (64, 16)
    assert heads.scaling == 0.25


def test_seeds_are_deterministic_and_independent_of_the_batch():
    config = WorldConfig(seed=3)
    batch = make_dialogs(config, SCENARIOS["mixed"], [0, 1, 2, 3])
    single = make_dialogs(config, SCENARIOS["mixed"], [2])
    assert torch.equal(batch.x[2], single.x[0])
    assert torch.equal(make_dialogs(config, SCENARIOS["mixed"], [0, 1, 2, 3]).x, batch.x)
    assert not torch.equal(batch.x[0], batch.x[1])
    assert not torch.equal(make_dialogs(WorldConfig(seed=4), SCENARIOS["mixed"], [0]).x[0], batch.x[0])
    assert torch.equal(projections(config).w_q, projections(WorldConfig(seed=3)).w_q)
    assert not torch.equal(projections(config).w_q, projections(WorldConfig(seed=4)).w_q)
    assert not torch.equal(projections(config).w_q, projections(config).w_k)
    assert torch.equal(projections(WorldConfig(tied_qk=True)).w_k, projections(WorldConfig(tied_qk=True)).w_q)


def test_token_statistics():
    """x = z + 0.8 d with z ~ N(0, 0.05 I): 0.05 is the variance of every coordinate."""
    dialogs = make_dialogs(WorldConfig(), SCENARIOS["topic_shift"], list(range(20)))
    tokens_direction = dialogs.directions.float().repeat_interleave(32, dim=1)
    noise = dialogs.x - 0.8 * tokens_direction
    assert abs(noise.mean()) < 0.005
    assert noise.var().item() == pytest.approx(0.05, rel=0.02)
    along = (dialogs.x * tokens_direction).sum(-1)
    assert along.mean().item() == pytest.approx(0.8, abs=0.01)
    assert along.var().item() == pytest.approx(0.05, rel=0.1)
    small = make_dialogs(WorldConfig(noise_var=0.0025), SCENARIOS["topic_shift"], [0])
    residual = small.x - 0.8 * small.directions.float().repeat_interleave(32, dim=1)
    assert residual.std().item() == pytest.approx(0.05, rel=0.05)


def test_examples_have_stable_ids(task):
    examples = task.examples()
    assert len(examples) == 5 * 4
    assert examples[7].example_id == "topic_return/0003" and examples[7].subtask == "topic_return"
    assert task.protocol is TaskProtocol.WORLD and task.name == "dialogs"
    assert "n_dialogs" not in task.identity() and task.identity()["budget"] == 56
    built = instantiate(compose_config("task=dialogs", "task.n_dialogs=2").task)
    assert isinstance(built, DialogTask) and built.n_dialogs == 2 and built.scenarios == list(SCENARIOS)


def test_run_example_record(task):
    example = task.examples()[0]
    record = task.run_example(world_method("fdkvc"), example)
    assert set(record) >= {"metrics", "prediction", "new_tokens", "cache_len_final", "latency_s"}
    assert record["cache_len_final"] == 56 and record["new_tokens"] == 9 * 32
    assert set(record["metrics"]) >= {
        "alignment",
        "retention",
        "diversity",
        "adaptation",
        "latency_ms_per_turn",
    }
    assert all(math.isfinite(v) for v in record["metrics"].values())


@pytest.mark.parametrize("name", WORLD_METHODS)
def test_budget_held_at_every_step_and_batch_equals_single_dialogs(task, name):
    method = world_method(name)
    batched = task.evaluate(method, ["mixed"], n=3)
    assert batched.attrs["max_step_cache_len"] <= 56
    for index in range(3):
        example = task.examples()[2 * task.n_dialogs + index]
        assert example.example_id == f"mixed/{index:04d}"
        single = task.run_example(method, example)
        assert single["max_cache_len"] <= 56 and single["cache_len_final"] == 56
        for metric in ("alignment", "retention", "diversity", "adaptation"):
            assert single["metrics"][metric] == pytest.approx(batched[metric][index], abs=1e-5), metric


def test_fdkvc_without_bias_or_eviction_equals_the_full_cache():
    roomy = DialogTask(n_dialogs=3, budget=10_000, scenarios=["mixed", "gradual"])
    full = roomy.evaluate(MethodPolicy(FullCache()))
    plain = roomy.evaluate(MethodPolicy(FDKVC(beta=0.0, selection=Selection(budget_tokens=56))))
    assert torch.allclose(torch.tensor(plain["alignment"]), torch.tensor(full["alignment"]), atol=1e-6)
    assert torch.equal(torch.tensor(plain["retention"]), torch.tensor(full["retention"]))
    biased = roomy.evaluate(MethodPolicy(FDKVC(beta=0.25, selection=Selection(budget_tokens=56))))
    assert not torch.allclose(torch.tensor(biased["alignment"]), torch.tensor(full["alignment"]), atol=1e-4)


def test_adaptation_counts_turns_and_never():
    retention = torch.tensor([[1.0, 0.2, 0.5, 0.9, 0.9], [1.0, 0.9, 0.9, 0.9, 0.9], [1.0, 0.1, 0.1, 0.1, 0.1]])
    speed, never = adaptation(retention, [1], threshold=0.8)
    assert speed[:, 0].tolist() == [3.0, 1.0, 4.0]
    assert never[:, 0].tolist() == [False, False, True]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (
            {"scenarios": ["topic_swap"]},
            "task.scenarios=['topic_swap'] names an unknown scenario 'topic_swap' — choose from topic_shift,",
        ),
        ({"scenarios": []}, "task.scenarios=[] is empty — choose from topic_shift,"),
        ({"n_dialogs": "abc"}, "task.n_dialogs='abc' must be an integer >= 1 — use e.g. task.n_dialogs=600"),
        ({"budget": 0}, "task.budget=0 must be an integer >= 1 — use e.g. task.budget=56"),
        ({"tokens_per_turn": 2.5}, "task.tokens_per_turn=2.5 must be an integer >= 1 — "),
        ({"late_turns": "3"}, "task.late_turns='3' must be an integer >= 1 — "),
        ({"seed": "x"}, "task.seed='x' must be an integer — "),
        ({"noise_var": -0.1}, "task.noise_var=-0.1 must be a number >= 0 — use e.g. task.noise_var=0.05"),
        ({"topic_scale": "big"}, "task.topic_scale='big' must be a number — "),
        ({"weight_std": "wide"}, "task.weight_std='wide' must be a number — "),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: DialogTask(**options), named)
