"""A batch's steady rows as one step (``harness.decode.steady.SteadyRows``, ``numerics`` 2 and 3): each row keeps
what it keeps alone, the step's kernels do not grow with the rows, nothing is read on the host, one graph per path."""

from __future__ import annotations

import pytest
import torch
from conftest import named_method
from test_batching import figures, prompts
from test_steady import CAPTURED, _Steps, prompt

from harness.decode import engine as engine_module
from harness.decode.engine import Engine, Request
from harness.decode.steady import SteadyRows
from methods.scored_rows import ScoredRows


def stacked_steps(monkeypatch) -> list[tuple[int, int]]:
    """Every ``SteadyRows`` step: its row count, and how many of its rows observe it."""
    rows: list[tuple[int, int]] = []
    original = SteadyRows.step

    def step(self, observing):
        rows.append((len(self.sequences), sum(observing)))
        return original(self, observing)

    monkeypatch.setattr(SteadyRows, "step", step)
    return rows


def finished_rows(monkeypatch) -> list:
    """Each sequence ``Engine`` finishes: its tokens, final positions and method state (a scored method's)."""
    rows = []
    original = engine_module._Sequence.generation

    def keep(self):
        generation = original(self)
        positions = [p.clone() for p in self.state.driver.positions]
        rows.append((tuple(generation.tokens), positions, self.method.state.clone()))
        return generation

    monkeypatch.setattr(engine_module._Sequence, "generation", keep)
    return rows


@pytest.mark.parametrize("numerics", [2, 3, 4])
@pytest.mark.parametrize("name", [*CAPTURED, "inertia_reserve"])
def test_steady_rows_keep_what_each_row_keeps_alone_under_the_reference(tiny_models, monkeypatch, name, numerics):
    """Five prompts of different lengths (so different budgets: the rows' slots are padded), three decoding
    together, two joining as others finish; the reference decodes each alone."""
    model = tiny_models["tiny_llama"]
    kept = finished_rows(monkeypatch)
    requests = [Request(ids, 14 + 3 * i, seed=i) for i, ids in enumerate(prompts())]
    alone = [Engine(model, named_method(name, "rho=0.5")).generate(request) for request in requests]
    reference = {tokens: (positions, state) for tokens, positions, state in kept}
    kept.clear()
    rows = stacked_steps(monkeypatch)
    engine = Engine(model, named_method(name, "rho=0.5"), numerics=numerics, token_lag=4)
    batched = dict(engine.generate_batch(enumerate(requests), 3))
    assert [figures(g) for g in alone] == [figures(batched[i]) for i in range(len(requests))]
    assert len(kept) == len(requests)
    for tokens, positions, state in kept:
        alone_positions, alone_state = reference[tokens]
        assert all(map(torch.equal, positions, alone_positions))
        # A padded softmax and a batch's products (and under 3 the regrouped sums) round in other last bits than
        # one row's do.
        assert torch.allclose(state, alone_state, rtol=1e-5, atol=1e-7) and bool(alone_state.any())
    # Most steps ran stacked, three rows at a time while three were decoding.
    assert len(rows) > 25 and max(count for count, _ in rows) == 3
    if name == "inertia_lazy":
        # Rows that joined at different steps observe at different steps: only some rows observed these.
        assert any(0 < observing < count for count, observing in rows)


def step_counts(model, name: str, rows: int) -> list:
    steps: list = []
    engine = Engine(model, named_method(name, "rho=0.5"), token_lag=4, numerics=2)
    engine.around_step = lambda step: _Steps(steps, step)
    requests = [Request(prompt(length=100 + 7 * row, seed=row), 30) for row in range(rows)]
    list(engine.generate_batch(enumerate(requests), rows))
    return [counts for step, _, counts in steps if step > 8]


@pytest.mark.parametrize("name", CAPTURED)
def test_a_stacked_step_reads_nothing_on_the_host_and_runs_as_many_kernels_whatever_the_rows(tiny_models, name):
    model = tiny_models["tiny_llama"]
    two, five = step_counts(model, name, 2), step_counts(model, name, 5)
    assert two and five and all(counts.sync_count == 0 for counts in two + five)
    # Lazy-4's rows observe at the same steps here (they joined together): both paths appear in both runs.
    assert {sum(c.kernels.values()) for c in two} == {sum(c.kernels.values()) for c in five}
    alone = Engine(model, named_method(name, "rho=0.5"), token_lag=4)
    single: list = []
    alone.around_step = lambda step: _Steps(single, step)
    alone.generate(Request(prompt(length=100), 30))
    most = max(sum(counts.kernels.values()) for step, _, counts in single if step > 8)
    # The masks and the rows' own positions cost a few kernels more than one sequence's step.
    assert max(sum(c.kernels.values()) for c in five) <= 1.2 * most


@pytest.mark.parametrize(
    "name,numerics", [("inertia", 2), ("inertia_lazy", 2), ("inertia", 3), ("inertia", 4), ("inertia_lazy", 4)]
)
def test_stacked_steps_compile_as_one_graph_per_path_and_never_recompile(tiny_models, monkeypatch, name, numerics):
    model = tiny_models["tiny_llama"]
    torch._dynamo.reset()
    steps: list = []
    rows = stacked_steps(monkeypatch)
    requests = [Request(prompt(length=100 + 9 * row, seed=row), 90) for row in range(3)]
    engine = Engine(model, named_method(name, "rho=0.5"), steady="compiled", token_lag=4, numerics=numerics)
    engine.around_step = lambda step: _Steps(steps, step, graphs=True)
    # fullgraph=True: a graph break raises here.
    compiled = dict(engine.generate_batch(enumerate(requests), 3))
    reference = Engine(model, named_method(name, "rho=0.5"), numerics=numerics)
    eager = dict(reference.generate_batch(enumerate(requests), 3))
    assert [compiled[i].tokens for i in range(3)] == [eager[i].tokens for i in range(3)]
    late = [made for step, made, _ in steps if step > 8]
    assert len(rows) >= 64 and sum(late) == 0, f"{name} recompiled after its warm-up"
    assert all(observing in (0, count) for count, observing in rows)  # rows that joined together stay in phase
    assert sum(made for _, made, _ in steps) == (2 if name == "inertia_lazy" else 1)


def test_methods_stack_only_with_equal_options_and_a_scorer_that_takes_rows(tiny_models):
    model = tiny_models["tiny_llama"]
    methods = []
    for name, extra in (("inertia", ()), ("inertia", ()), ("inertia", ("method.aggregator.alpha=0.5",))):
        method = named_method(name, "rho=0.5", *extra)
        Engine(model, method).generate(Request(prompt(), 12))
        methods.append(method)
    assert all(method.steady() for method in methods)
    assert isinstance(methods[0].stack(methods[:2], [13, 13]), ScoredRows)
    assert methods[0].stack(methods, [13, 13, 13]) is None
    # Recency is order-free (so steady) but declares no stacked form.
    recency = named_method("inertia", "rho=0.5", "method/scorer=recency")
    Engine(model, recency).generate(Request(prompt(), 12))
    assert recency.steady() and recency.stack([recency, recency], [13, 13]) is None
