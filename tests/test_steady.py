"""The steady step (``harness.decode.steady``): the eager step's outputs exactly, no host sync, one graph per path."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from conftest import named_method
from test_batching import METHODS, TIMINGS, extra_overrides

from harness.config import model_spec
from harness.decode import engine as engine_module
from harness.decode import kv_cache
from harness.decode.counting import counting
from harness.decode.engine import Engine, Request
from harness.decode.steady import SteadyLoop
from harness.models import load_tokenizer

# The methods the issue names for capture; every method preset is checked for equality below.
CAPTURED = ("inertia", "inertia_lazy", "score_free", "tova_decode", "h2o")
# StreamingLLM+ serves StreamingLLM's pattern on fine-tuned weights (tests/test_kvpop_training.py).
PRESETS = [name for name in METHODS if name != "streaming_llm_plus"]


def prompt(length: int = 120, seed: int = 0) -> list[int]:
    return torch.randint(0, 1000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def finished(monkeypatch) -> list:
    """The sequences ``Engine.generate`` finishes, with their final cache and positions."""
    kept = []
    original = engine_module._Sequence.generation

    def keep(self):
        generation = original(self)
        positions = [p.clone() if isinstance(p, torch.Tensor) else p for p in self.state.driver.positions]
        kept.append((generation, [(k.clone(), v.clone()) for k, v in kv_cache.layer_tensors(self.cache)], positions))
        return generation

    monkeypatch.setattr(engine_module._Sequence, "generation", keep)
    return kept


def counted_steady_steps(monkeypatch) -> list[int]:
    runs: list[int] = []
    original = SteadyLoop.run

    def run(self, observing):
        runs.append(int(observing))
        return original(self, observing)

    monkeypatch.setattr(SteadyLoop, "run", run)
    return runs


@pytest.mark.parametrize("name", PRESETS)
def test_the_steady_step_gives_the_eager_steps_outputs_and_kept_sets(tiny_models, tmp_path, monkeypatch, name):
    model = tiny_models["tiny_llama"]
    overrides = ("rho=0.5", "model=tiny_llama", *extra_overrides(name, model, tmp_path))
    tokenizer = load_tokenizer(model_spec("tiny_llama"))
    kept = finished(monkeypatch)
    runs = counted_steady_steps(monkeypatch)
    request = Request(prompt(), 24, stop_token_ids={999_999})
    Engine(model, named_method(name, *overrides), tokenizer=tokenizer, profile=True).generate(request)
    assert runs == []  # profiled: every step eager
    Engine(model, named_method(name, *overrides), tokenizer=tokenizer).generate(request)
    (eager, eager_cache, eager_positions), (steady, steady_cache, steady_positions) = kept
    untimed = lambda g: {k: v for k, v in dataclasses.asdict(g).items() if k not in TIMINGS}  # noqa: E731
    assert untimed(steady) == untimed(eager)
    for (a_keys, a_values), (b_keys, b_values) in zip(eager_cache, steady_cache, strict=True):
        assert torch.equal(a_keys, b_keys) and torch.equal(a_values, b_values)
    for a, b in zip(eager_positions, steady_positions, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else all(map(torch.equal, a, b))
    if name in CAPTURED:
        assert len(runs) >= 20, f"{name} never reached its steady state"


def test_unprofiled_runs_time_the_step_not_the_method(tiny_models):
    model = tiny_models["tiny_llama"]
    plain = Engine(model, named_method("inertia", "rho=0.5")).generate(Request(prompt(), 8))
    profiled = Engine(model, named_method("inertia", "rho=0.5"), profile=True).generate(Request(prompt(), 8))
    assert plain.decode_s > 0 and plain.score_s is None and plain.evict_s is None
    assert profiled.score_s > 0 and profiled.evict_s >= 0


@pytest.mark.parametrize("name", PRESETS)
def test_tokens_read_late_stop_where_tokens_read_at_once_do(tiny_models, tmp_path, monkeypatch, name):
    # A steady step, and a step of a cache that only grows (no budget, or a prefill-time method after its cut:
    # ragged AdaKV+EA's included), runs past a stop it reads late; its record is that of reading at once. A cache
    # that only grows is cut back to the very entries and positions (a steady one has evicted past the stop).
    model = tiny_models["tiny_llama"]
    overrides = ("rho=0.5", "model=tiny_llama", *extra_overrides(name, model, tmp_path))
    tokenizer = load_tokenizer(model_spec("tiny_llama"))
    engine = lambda lag: Engine(model, named_method(name, *overrides), tokenizer=tokenizer, token_lag=lag)  # noqa: E731
    first = engine(0).generate(Request(prompt(seed=3), 30))
    stop = first.tokens[17]
    kept = finished(monkeypatch)
    at_once = engine(0)
    expected = at_once.generate(Request(prompt(seed=3), 30, {stop}))
    late = engine(5).generate(Request(prompt(seed=3), 30, {stop}))
    assert late.tokens == expected.tokens == first.tokens[: first.tokens.index(stop) + 1]
    untimed = lambda g: {k: v for k, v in dataclasses.asdict(g).items() if k not in TIMINGS}  # noqa: E731
    assert untimed(late) == untimed(expected)
    if not at_once.method.appends_only():
        return
    (_, at_once_cache, at_once_positions), (_, late_cache, late_positions) = kept
    for (a_keys, a_values), (b_keys, b_values) in zip(at_once_cache, late_cache, strict=True):
        assert torch.equal(a_keys, b_keys) and torch.equal(a_values, b_values)
    for a, b in zip(at_once_positions, late_positions, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else all(map(torch.equal, a, b))


class _Steps(contextlib.AbstractContextManager):
    """Counts each step's kernels and syncs (``counting``), or with ``graphs`` the graphs dynamo made in it
    (a dispatch mode and a compiled function do not run together)."""

    def __init__(self, into: list, step: int, graphs: bool = False) -> None:
        self.into, self.step, self.graphs = into, step, graphs

    def __enter__(self) -> None:
        self.before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self.counter = contextlib.nullcontext() if self.graphs else counting()
        self.counts = self.counter.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.counter.__exit__(*exc)
        made = torch._dynamo.utils.counters["stats"]["unique_graphs"] - self.before
        self.into.append((self.step, made, self.counts))


@pytest.mark.parametrize(
    "name,numerics", [*((name, 1) for name in CAPTURED), ("inertia", 3), ("tova_decode", 3), ("inertia", 4), ("h2o", 4)]
)
def test_the_steady_step_compiles_as_one_graph_per_path_and_never_recompiles(tiny_models, monkeypatch, name, numerics):
    model = tiny_models["tiny_llama"]
    torch._dynamo.reset()
    steps: list = []
    runs = counted_steady_steps(monkeypatch)
    engine = Engine(model, named_method(name, "rho=0.5"), steady="compiled", token_lag=4, numerics=numerics)
    engine.around_step = lambda step: _Steps(steps, step, graphs=True)
    # fullgraph=True: a graph break raises here.
    compiled = engine.generate(Request(prompt(), 90))
    eager = Engine(model, named_method(name, "rho=0.5"), numerics=numerics).generate(Request(prompt(), 90))
    assert compiled.tokens == eager.tokens
    paths = len(set(runs))
    warm_up = 8  # Lazy-4 meets its observing path within four steady steps
    late = [made for step, made, _ in steps if step > warm_up]
    assert len(late) >= 64 and sum(late) == 0, f"{name} recompiled after its warm-up"
    assert sum(made for _, made, _ in steps) == paths


# Methods that cut at the prefill only: their caches only grow while decoding.
PREFILL_TIME = ("snapkv", "adakv_ea", "keydiff", "kvzip", "kvzip_mask")


@pytest.mark.parametrize("name", ["full", *CAPTURED, *PREFILL_TIME])
def test_a_steady_step_or_one_that_only_appends_reads_nothing_on_the_host(tiny_models, name):
    model = tiny_models["tiny_llama"]
    steps: list = []
    tokenizer = load_tokenizer(model_spec("tiny_llama"))
    engine = Engine(model, named_method(name, "rho=0.5"), tokenizer=tokenizer, token_lag=4)
    engine.around_step = lambda step: _Steps(steps, step)
    engine.generate(Request(prompt(), 30))
    late = [counts for step, _, counts in steps if step > 8]
    assert late and all(counts.sync_count == 0 for counts in late), [dict(c.syncs) for c in late]


def test_one_refill_serves_every_layer(tiny_models):
    model = tiny_models["tiny_llama"]
    steps: list = []
    engine = Engine(model, named_method("score_free", "rho=0.5"), token_lag=4)
    engine.around_step = lambda step: _Steps(steps, step)
    engine.generate(Request(prompt(), 20))
    counts = steps[-1][2]
    # Keys, values and the positions table: one scatter each, however many layers (and one more gives the
    # unobserved newest entry its state); no top-k, one argmin.
    assert counts.kernels["scatter_"] == 4 and counts.kernels["argmin"] == 1 and "topk" not in counts.kernels


def inertia_step_kernels(model, numerics: int) -> dict:
    """The kernels of InertiaKV's last steady step on ``model`` under ``numerics``, by operation."""
    steps: list = []
    engine = Engine(model, named_method("inertia", "rho=0.5"), token_lag=4, numerics=numerics)
    engine.around_step = lambda step: _Steps(steps, step)
    engine.generate(Request(prompt(), 20))
    return steps[-1][2].kernels


def test_numerics_3_pools_the_heads_in_one_mean_and_decays_inertias_state_once_a_step(tiny_models):
    model = tiny_models["tiny_llama"]
    layers = model.config.num_hidden_layers
    counts = {numerics: inertia_step_kernels(model, numerics) for numerics in (2, 3)}
    # Per layer: the group mean and the heads' mean, the decay, then the scaled add (one kernel: index_add_).
    assert counts[2]["mean"] - counts[3]["mean"] == layers
    assert counts[2]["mul_"] == layers and counts[3]["mul_"] == 1
    assert counts[2]["index_add_"] == counts[3]["index_add_"] == layers and "scatter_add_" not in counts[2]
    assert sum(counts[2].values()) - sum(counts[3].values()) == 2 * layers - 1


def test_numerics_4_folds_inertias_layers_at_once_and_its_scale_into_the_product(tiny_models):
    model = tiny_models["tiny_llama"]
    layers = model.config.num_hidden_layers
    counts = {numerics: inertia_step_kernels(model, numerics) for numerics in (3, 4)}
    # The layers' weights wait for the last layer: one stack, one weighted mean, one decay, one scaled add.
    assert counts[3]["mean"] - counts[4]["mean"] == layers - 1 and counts[4]["stack"] == 1
    assert counts[3]["index_add_"] == layers and counts[4]["index_add_"] == counts[4]["mul_"] == 1
    # Each layer's logits in one product with their scale (one mul a step weighs the layers).
    assert counts[4]["baddbmm"] == layers and counts[3]["mul"] - counts[4]["mul"] == layers - 1
    assert counts[3]["matmul"] - counts[4]["matmul"] == layers
    assert sum(counts[3].values()) - sum(counts[4].values()) == 3 * layers - 4


@pytest.mark.parametrize("token_lag", [0, 4])
@pytest.mark.parametrize(
    "name,numerics",
    [(name, 1) for name in ("full", "inertia", "score_free", "adakv_ea")]
    + [("full", 2), ("snapkv", 2), ("adakv_ea", 2), ("inertia", 2)],
)
def test_a_batch_step_reads_its_rows_tokens_late_or_in_one_host_read(tiny_models, name, numerics, token_lag):
    # The batch step feeds its rows' tokens from the device (and under numerics 2 a step that only appends writes
    # and attends all rows at once). Read at once, the rows' tokens come back in one read; read late, as their
    # steps would be alone, in none.
    model = tiny_models["tiny_llama"]
    steps: list = []
    engine = Engine(model, named_method(name, "rho=0.5"), token_lag=token_lag, numerics=numerics)
    engine.around_step = lambda step: _Steps(steps, step)
    requests = [Request(prompt(seed=seed), 30) for seed in range(4)]
    list(engine.generate_batch(enumerate(requests), 4))
    late = [counts for step, _, counts in steps if step > 8]
    expected = 0 if token_lag else 1
    assert late and all(counts.sync_count == expected for counts in late), [dict(c.syncs) for c in late]
