"""The synthetic dialog world (FD-KVC paper): construction, metrics, and methods driven through it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import refused
from hydra.utils import instantiate

from harness.config import compose_config
from harness.protocols.dialog_world import MethodPolicy
from methods.fdkvc import FDKVC
from methods.full import FullCache
from methods.selection import Selection
from tasks.base import TaskProtocol
from tasks.dialogs import BENCHMARK, SCENARIOS, SCHEDULES, DialogTask, WorldConfig
from tasks.dialogs.simulate import adaptation
from tasks.dialogs.world import gram_schmidt, make_dialogs, projections

WORLD_METHODS = ("fifo", "sink_window", "h2o", "tova_decode", "inertia", "cumulative", "fdkvc")


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
    assert turns == {"topic_shift": 10, "topic_return": 10, "mixed": 12, "complex": 20, "gradual": 12, "adaptation": 19}
    assert SCENARIOS["topic_shift"].turn_labels() == [0] * 3 + [1] * 7
    assert SCENARIOS["topic_return"].turn_labels() == [0] * 3 + [1] * 4 + [0] * 3
    assert SCENARIOS["mixed"].turn_labels() == [0, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 1]
    assert SCENARIOS["complex"].turn_labels() == [k for k in (0, 1, 2, 3, 4, 0, 2, 1, 0, 3) for _ in range(2)]
    assert SCENARIOS["adaptation"].turn_labels() == [0] * 3 + [1] * 16
    # Gradual: turn 1 pure A, B's weight grows over turns 2..8 (1-based) and is 1 from turn 8.
    shares = [weights[1] for weights in SCENARIOS["gradual"].mixtures]
    assert shares[0] == 0.0 and shares[7:] == [1.0] * 5
    assert shares[1:8] == pytest.approx([k / 7 for k in range(1, 8)])
    assert SCENARIOS["complex"].shifts() == [2, 4, 6, 8, 10, 12, 14, 16, 18]
    # The alternatives change one scenario of the paper's: Complex's first 16 turns, or Gradual's blend.
    complex_labels = {
        "complex_returns": (0, 1, 2, 3, 4, 3, 2, 1, 0, 4),
        "complex_interleaved": (0, 1, 0, 2, 0, 3, 0, 4, 0, 1),
    }
    for reading, segments in complex_labels.items():
        assert SCHEDULES[reading]["complex"].turn_labels() == [k for k in segments for _ in range(2)]
    assert SCHEDULES["complex_long"]["complex"].turn_labels() == [0] * 4 + [
        k for k in (1, 2, 3, 4) for _ in range(3)
    ] + [0, 0, 1, 1]
    gradual = {reading: [w[1] for w in SCHEDULES[reading]["gradual"].mixtures] for reading in SCHEDULES}
    assert gradual["gradual_endpoints"] == pytest.approx([0, 0, *(k / 6 for k in range(1, 7)), 1, 1, 1, 1])
    assert gradual["gradual_zero_based"] == pytest.approx([0, 0, *(k / 7 for k in range(1, 8)), 1, 1, 1])
    assert gradual["gradual_arc"] == pytest.approx([math.sin(math.pi / 2 * share) for share in gradual["paper"]])
    for reading, scenarios in SCHEDULES.items():
        changed = {name for name, scenario in scenarios.items() if scenario != SCENARIOS[name]}
        assert changed == {"paper": set(), "even": {"topic_shift", "mixed", "complex"}}.get(
            reading, {reading.split("_")[0]}
        ), reading
    even = SCHEDULES["even"]
    assert even["topic_shift"].turn_labels() == [0] * 5 + [1] * 5
    assert even["mixed"].turn_labels() == [0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 1, 1]
    assert even["complex"].turn_labels() == [k for k in range(5) for _ in range(4)]


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
    """x = z + 0.8 d with z ~ N(0, 0.05 I): 0.05 read as the std of every coordinate, or as its variance."""
    dialogs = make_dialogs(WorldConfig(noise_var=0.05), SCENARIOS["topic_shift"], list(range(20)))
    tokens_direction = dialogs.directions.float().repeat_interleave(32, dim=1)
    noise = dialogs.x - 0.8 * tokens_direction
    assert abs(noise.mean()) < 0.005
    assert noise.var().item() == pytest.approx(0.05, rel=0.02)
    along = (dialogs.x * tokens_direction).sum(-1)
    assert along.mean().item() == pytest.approx(0.8, abs=0.01)
    assert along.var().item() == pytest.approx(0.05, rel=0.1)
    small = make_dialogs(WorldConfig(), SCENARIOS["topic_shift"], [0])
    residual = small.x - 0.8 * small.directions.float().repeat_interleave(32, dim=1)
    assert residual.std().item() == pytest.approx(0.05, rel=0.05)


def test_examples_have_stable_ids(task):
    examples = task.examples()
    assert len(examples) == 6 * 4
    assert examples[7].example_id == "topic_return/0003" and examples[7].subtask == "topic_return"
    assert task.protocol is TaskProtocol.WORLD and task.name == "dialogs"
    assert "n_dialogs" not in task.identity() and task.identity()["budget"] == 56
    assert task.reading == "paper"
    # Another world's records are other examples: its readings name the subtask.
    other = DialogTask(n_dialogs=1, schedule="even", noise_var=0.05)
    assert other.reading == "task.schedule=even task.noise_var=0.05"
    assert other.examples()[0].subtask == "topic_shift [task.schedule=even task.noise_var=0.05]"
    assert other.examples()[0].example_id == "topic_shift/0000"
    built = instantiate(compose_config("task=dialogs", "task.n_dialogs=2").task)
    assert isinstance(built, DialogTask) and built.n_dialogs == 2 and built.scenarios == list(SCENARIOS)


def test_run_example_record(task):
    example = task.examples()[0]
    record = task.run_example(world_method("fdkvc"), example)
    assert set(record) >= {"metrics", "prediction", "new_tokens", "cache_len_final", "latency_s"}
    assert record["cache_len_final"] == 56 and record["new_tokens"] == 9 * 32
    assert record["kv_entries_final"] == record["kv_entries_held"] == 56.0
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


def baseline_figures(name: str, **options) -> dict[str, float]:
    """The five-scenario means (%) of a baseline over four dialogs each, and its Table 2 adaptation."""
    world = DialogTask(n_dialogs=4, **options)
    frame = world.evaluate(world_method(name)).groupby("scenario").mean(numeric_only=True)
    benchmark = frame.loc[list(BENCHMARK)]
    return {
        "retention": round(100 * benchmark["retention"].mean(), 1),
        "diversity": round(100 * benchmark["diversity"].mean(), 1),
        "adaptation": float(frame.loc["adaptation", "adaptation"]),
        "never": float(frame.loc["adaptation", "adaptation_never"]),
    }


def test_the_baseline_figures_follow_from_the_schedules():
    """The paper's FIFO, Sink+Window and H2O figures, which the topic schedules alone decide.

    FIFO keeps the last 56 tokens, 1.75 turns: late retention is 1 where the last three turns
    share a topic and 6/7 where one of them opens a new one (Topic Return, Mixed, Complex):
    (1 + 6/7 + 6/7 + 6/7 + 1) / 5 = 91.4%; diversity is one topic, or two where the window
    spans a shift: (1/2 + 2/3 + 4/9 + 4/15 + 1/2) / 5 = 47.6%. H2O's cumulative scores keep
    the first topic's tokens: half the cache stays A, so it never adapts in Table 2's dialog.
    """
    fifo = baseline_figures("fifo")
    assert (fifo["retention"], fifo["diversity"]) == (91.4, 47.6)
    exact = (1 + 6 / 7 + 6 / 7 + 6 / 7 + 1) / 5, (1 / 2 + 2 / 3 + 4 / 9 + 4 / 15 + 1 / 2) / 5
    assert (round(100 * exact[0], 1), round(100 * exact[1], 1)) == (91.4, 47.6)
    assert baseline_figures("sink_window")["diversity"] == 73.3
    h2o = baseline_figures("h2o")
    assert (h2o["diversity"], h2o["retention"]) == (70.0, 63.3)
    assert (h2o["adaptation"], h2o["never"]) == (16.0, 1.0)
    # The earlier schedules (Topic Shift 5A+5B, ...) do not give the paper's figures.
    even = baseline_figures("fifo", schedule="even")
    assert (even["retention"], even["diversity"]) != (91.4, 47.6)


@pytest.mark.parametrize("schedule", [r for r in SCHEDULES if r.startswith(("complex_", "gradual_"))])
def test_the_alternative_schedules_keep_every_baseline_figure(schedule: str):
    """Complex's figures pin only its last four turns (A A, then another topic); Gradual's, only that its
    late turns and the turn before them are pure B. Every alternative keeps them."""
    fifo = baseline_figures("fifo", schedule=schedule)
    assert (fifo["retention"], fifo["diversity"]) == (91.4, 47.6)
    assert baseline_figures("sink_window", schedule=schedule)["diversity"] == 73.3
    h2o = baseline_figures("h2o", schedule=schedule)
    assert (h2o["diversity"], h2o["retention"], h2o["adaptation"]) == (70.0, 63.3, 16.0)


def test_diversity_by_cosine_parts_from_the_labels_with_noise_as_the_variance():
    def diversity(**options) -> dict[str, float]:
        world = DialogTask(n_dialogs=4, scenarios=list(BENCHMARK), **options)
        frame = world.evaluate(world_method("fifo")).groupby("scenario").mean(numeric_only=True)
        return {name: round(100 * value, 1) for name, value in frame["diversity"].items()}

    labels, cosine = diversity(), diversity(diversity="cosine")
    # Small noise: a token is near its own topics only, so the readings agree but on Gradual, whose
    # blended turns are near both; FIFO's late turns there are pure B, so even Gradual agrees.
    assert cosine == labels
    noisy = diversity(noise_var=0.05)
    noisy_cosine = diversity(noise_var=0.05, diversity="cosine")
    assert noisy == labels and all(noisy_cosine[s] >= noisy[s] for s in BENCHMARK) and noisy_cosine != noisy


def test_the_diversity_reading_enters_the_run_id_only_when_changed():
    paper, cosine = DialogTask(n_dialogs=1), DialogTask(n_dialogs=1, diversity="cosine")
    assert "diversity" not in paper.identity() and cosine.identity()["diversity"] == "cosine"
    assert cosine.reading == "task.diversity=cosine"
    assert DialogTask(schedule="gradual_arc").reading == "task.schedule=gradual_arc"


def test_run_batches_records_what_single_dialogs_record():
    world = DialogTask(n_dialogs=3, scenarios=["topic_return", "gradual"], batch_size=2)
    policy = world_method("fdkvc")
    batches = list(world.run_batches(policy, world.examples()))
    assert [len(batch) for batch in batches] == [2, 1, 2, 1]
    for example, outcome in (pair for batch in batches for pair in batch):
        single = world.run_example(policy, example)
        for metric in ("alignment", "retention", "diversity", "adaptation"):
            assert outcome["metrics"][metric] == pytest.approx(single["metrics"][metric], abs=1e-5), metric
        assert outcome["turns"]["retention"] == pytest.approx(single["turns"]["retention"], abs=1e-4)
        assert outcome["world"] == single["world"] == "paper" and outcome["batch"] in (1, 2)
        assert (
            len(outcome["turns"]["ownership_loss"])
            == len(outcome["turns"]["alignment"])
            == 10 + 2 * (example.subtask == "gradual")
        )


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
        ({"noise_var": -0.1}, "task.noise_var=-0.1 must be a number >= 0 — use e.g. task.noise_var=0.0025"),
        ({"schedule": "uneven"}, "task.schedule='uneven' is not a choice — use one of paper, even"),
        ({"step": "chunk"}, "task.step='chunk' is not a choice — use one of turn, token"),
        ({"diversity": "labelled"}, "task.diversity='labelled' is not a choice — use one of labels, cosine"),
        (
            {"step": "token", "measure": "before_eviction"},
            "task.measure=before_eviction needs whole-turn steps, but task.step=token evicts after every token — ",
        ),
        ({"topic_scale": "big"}, "task.topic_scale='big' must be a number — "),
        ({"weight_std": "wide"}, "task.weight_std='wide' must be a number — "),
    ],
)
def test_bad_options_name_the_option_and_the_fix(options: dict, named: str) -> None:
    refused(lambda: DialogTask(**options), named)
