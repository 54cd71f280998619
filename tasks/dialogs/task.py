"""``task=dialogs``: the FD-KVC paper's synthetic dialog world as a task (no model loaded).

Each example is one dialog (``topic_shift/0007``); the world runs a cache policy (an eviction
method as the harness adapts it, ``tasks.dialogs.policy``) through it and returns its metrics.
``run_batches`` runs up to ``batch_size`` dialogs of a scenario side by side and yields their
records together (one write each batch); ``run_example`` runs one dialog alone; ``evaluate``
returns whole scenarios as a table, for scripts.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, ClassVar

import pandas as pd
import torch

from tasks.base import Example, Task, TaskProtocol, as_list, require_int, require_number
from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.simulate import DIVERSITIES, MEASURES, STEPS, Trace, adaptation, simulate
from tasks.dialogs.world import BENCHMARK, SCHEDULES, Dialogs, Scenario, WorldConfig, make_dialogs, projections

#: Options that only select or group examples: they stay out of the run id.
_SELECTING = ("scenarios", "n_dialogs", "batch_size")

#: The world's readings where the paper is ambiguous, at the paper's values. Records name the
#: ones a run changes (``DialogTask.reading``, in ``meta.world`` and in the subtask), so the
#: runs of several worlds share a results folder: a record's identity has no task hash.
PAPER_WORLD: dict[str, Any] = {
    "schedule": "paper",
    "noise_var": 0.0025,
    "step": "turn",
    "measure": "after_eviction",
    "diversity": "labels",
}
#: Readings added after runs were recorded, at the value those runs measured under: they enter the
#: run id only when changed, so the earlier runs keep their folders.
_LATER_READINGS: dict[str, Any] = {"diversity": "labels"}


def subtask_name(scenario: str, reading: str) -> str:
    """The subtask of ``scenario`` in the world of ``reading``: ``mixed``, ``mixed [task.schedule=even]``."""
    return scenario if reading == "paper" else f"{scenario} [{reading}]"


@functools.lru_cache(maxsize=8)
def _drawn(world: WorldConfig, scenario: Scenario, indices: tuple[int, ...]) -> Dialogs:
    # The jobs of a sweep share one process and draw the same dialogs for every method; the
    # largest scenario batch (Complex, 600 dialogs) holds about 100 MB.
    return make_dialogs(world, scenario, list(indices))


@dataclass
class DialogTask(Task):
    """Synthetic multi-turn dialogs with topic dynamics (the FD-KVC paper's benchmark, arXiv 2608.18098).

    Parameters:
        scenarios: subset of ``topic_shift``, ``topic_return``, ``mixed``, ``complex``, ``gradual``
            (the benchmark) and ``adaptation`` (the Table 2 dialog).
        n_dialogs: dialogs per scenario (600).
        seed: seed of the head's projections and of every dialog.
        budget: cache entries kept (56).
        tokens_per_turn: tokens per turn (32).
        dim, head_dim: embedding (64) and head (16) sizes.
        topic_scale: topic weight in a token (0.8).
        noise_var: variance of each noise coordinate (0.0025: the paper's N(0, 0.05 I) read as
            std 0.05; ``WorldConfig``).
        tied_qk: ``W_K = W_Q`` (off: the paper's independent projections).
        weight_std: std of the projection entries (None: ``1/sqrt(dim)``, N(0, 1/64)); larger
            values sharpen the head's attention (logits scale with its square).
        schedule: topic schedules, ``paper``, one of its alternatives for Complex or Gradual that keep the
            baseline figures (``complex_returns``, ``complex_interleaved``, ``complex_long``,
            ``gradual_endpoints``, ``gradual_zero_based``, ``gradual_arc``), or ``even``
            (``tasks.dialogs.world.SCHEDULES``).
        step: ``turn`` (a turn joins the cache at once and the method updates once per turn, as
            Algorithm 1) or ``token`` (one decode step per token).
        measure: ``after_eviction`` (metrics on the cache a turn leaves) or ``before_eviction``
            (on the cache its tokens have just joined; needs ``step=turn``).
        diversity: when a topic counts as present in the cache: ``labels`` (a cached token's turn is
            on it) or ``cosine`` (a cached token's cosine to it is above ``retention_threshold``,
            the retention's test; ``tasks.dialogs.simulate``).
        retention_threshold: cosine above which a cached token counts as on-topic (0.3).
        adaptation_threshold: retention that counts as adapted after a shift (0.8).
        late_turns: turns averaged by the "late" metrics (3).
        batch_size: dialogs run side by side and recorded in one write (the results do not
            depend on it).
    """

    name: ClassVar[str] = "dialogs"

    scenarios: list[str] = field(default_factory=lambda: list(SCHEDULES["paper"]))
    n_dialogs: int = 600
    seed: int = 0
    budget: int = 56
    tokens_per_turn: int = 32
    dim: int = 64
    head_dim: int = 16
    topic_scale: float = 0.8
    noise_var: float = 0.0025
    tied_qk: bool = False
    weight_std: float | None = None
    schedule: str = "paper"
    step: str = "turn"
    measure: str = "after_eviction"
    diversity: str = "labels"
    retention_threshold: float = 0.3
    adaptation_threshold: float = 0.8
    late_turns: int = 3
    batch_size: int = 600

    def __post_init__(self) -> None:
        choosing = (("schedule", tuple(SCHEDULES)), ("step", STEPS), ("measure", MEASURES), ("diversity", DIVERSITIES))
        for option, choices in choosing:
            if getattr(self, option) not in choices:
                raise ValueError(
                    f"task.{option}={getattr(self, option)!r} is not a choice — use one of {', '.join(choices)}"
                )
        if self.measure == "before_eviction" and self.step != "turn":
            raise ValueError(
                "task.measure=before_eviction needs whole-turn steps, but task.step=token evicts after every token "
                "— use task.step=turn, or task.measure=after_eviction"
            )
        self.scenarios = as_list("scenarios", self.scenarios)
        known = SCHEDULES[self.schedule]
        unknown = [s for s in self.scenarios if s not in known]
        if unknown or not self.scenarios:
            named = f"names an unknown scenario {unknown[0]!r}" if unknown else "is empty"
            raise ValueError(f"task.scenarios={self.scenarios!r} {named} — choose from {', '.join(known)}")
        integers = {"n_dialogs": 600, "budget": 56, "tokens_per_turn": 32, "dim": 64, "head_dim": 16, "late_turns": 3}
        for option, example in {**integers, "batch_size": 600}.items():
            require_int(option, getattr(self, option), example=example)
        require_int("seed", self.seed, minimum=None, example=0)
        require_number("noise_var", self.noise_var, 0.0025, minimum=0.0)
        for option, example in (("topic_scale", 0.8), ("retention_threshold", 0.3), ("adaptation_threshold", 0.8)):
            require_number(option, getattr(self, option), example)
        if self.weight_std is not None:
            require_number("weight_std", self.weight_std, 0.125)
        self.world = WorldConfig(
            dim=self.dim,
            head_dim=self.head_dim,
            tokens_per_turn=self.tokens_per_turn,
            topic_scale=self.topic_scale,
            noise_var=self.noise_var,
            tied_qk=self.tied_qk,
            weight_std=self.weight_std,
            seed=self.seed,
        )
        self.heads = projections(self.world)
        # The last batch drawn: scripts evaluate every method on one scenario in a row.
        self._last_dialogs: tuple[tuple[str, tuple[int, ...]], Dialogs] | None = None

    @property
    def protocol(self) -> TaskProtocol:
        return TaskProtocol.WORLD

    @property
    def reading(self) -> str:
        """The readings this world changes from ``PAPER_WORLD``, as overrides (``paper``: none)."""
        changed = [
            f"task.{name}={getattr(self, name)}" for name, paper in PAPER_WORLD.items() if getattr(self, name) != paper
        ]
        return " ".join(changed) or "paper"

    @property
    def benchmark(self) -> list[str]:
        """The chosen scenarios that make up the paper's composite (``adaptation`` is Table 2's alone)."""
        return [s for s in self.scenarios if s in BENCHMARK]

    def identity(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        for selecting in _SELECTING:
            fields.pop(selecting)
        for name, earlier in _LATER_READINGS.items():
            if fields[name] == earlier:
                fields.pop(name)
        return fields

    def examples(self, tokenizer: Any = None) -> list[Example]:
        out = []
        for scenario in self.scenarios:
            spec = SCHEDULES[self.schedule][scenario]
            for index in range(self.n_dialogs):
                out.append(
                    Example(
                        example_id=f"{scenario}/{index:04d}",
                        subtask=subtask_name(scenario, self.reading),
                        input_ids=[],
                        answers=[],
                        max_new_tokens=(spec.n_turns - 1) * self.tokens_per_turn,
                        meta={"scenario": scenario, "index": index, "n_turns": spec.n_turns},
                    )
                )
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        raise NotImplementedError("the dialog world has no text to score: use run_example(policy, example)")

    # ------------------------------------------------------------------ running
    def dialogs(self, scenario: str, indices: list[int]) -> Dialogs:
        """The dialogs ``indices`` of ``scenario`` (the last batch is reused)."""
        key = (scenario, tuple(indices))
        if self._last_dialogs is None or self._last_dialogs[0] != key:
            self._last_dialogs = (key, make_dialogs(self.world, SCHEDULES[self.schedule][scenario], indices))
        return self._last_dialogs[1]

    def simulate(self, policy: CachePolicy, dialogs: Dialogs) -> Trace:
        """``policy`` through ``dialogs`` under this world's budget, step and measurement."""
        return simulate(
            policy,
            dialogs,
            self.heads,
            self.budget,
            self.retention_threshold,
            self.seed,
            self.step,
            self.measure,
            self.diversity,
        )

    def _metrics(self, dialogs: Dialogs, trace: Trace, latency_s: float) -> dict[str, torch.Tensor]:
        late = slice(-self.late_turns, None)
        speed, never = adaptation(trace.retention, dialogs.scenario.shifts(), self.adaptation_threshold)
        n = len(dialogs)
        return {
            "alignment": trace.alignment[:, late].mean(dim=1),
            "retention": trace.retention[:, late].mean(dim=1),
            "diversity": trace.diversity[:, late].mean(dim=1),
            "adaptation": speed.mean(dim=1) if speed.shape[1] else torch.full((n,), float("nan")),
            "adaptation_never": never.float().mean(dim=1) if never.shape[1] else torch.zeros(n),
            "latency_ms_per_turn": torch.full((n,), 1e3 * latency_s),
            "method_ms_per_dialog_turn": torch.full((n,), 1e3 * trace.method_s / (n * dialogs.scenario.n_turns)),
        }

    def _latency(self, policy: CachePolicy, scenario: str, index: int) -> float:
        """Seconds inside the method per turn for dialog ``index`` of ``scenario`` run alone.

        The paper's latency is a single dialog's per-turn update; a batch shares one update
        among its dialogs, so its per-dialog share says nothing about that.
        """
        dialogs = make_dialogs(self.world, SCHEDULES[self.schedule][scenario], [index])
        return self.simulate(policy, dialogs).method_s / dialogs.scenario.n_turns

    def _outcomes(self, dialogs: Dialogs, trace: Trace, latency_s: float) -> list[dict[str, Any]]:
        """One record outcome per dialog of the batch."""
        metrics = {name: value.tolist() for name, value in self._metrics(dialogs, trace, latency_s).items()}
        # One entry holds a key and a value of head_dim float32 numbers.
        entry_bytes = 2 * self.head_dim * 4
        n_turns = dialogs.scenario.n_turns
        n = len(dialogs)
        final = int(trace.cache_len[-1])
        # The per-turn series the figures draw (four decimals: records are read back often).
        series = {
            "alignment": trace.alignment,
            "retention": trace.retention,
            "topic_retention": trace.topic_retention,
            **trace.probes,
        }
        rounded = {name: torch.round(value, decimals=4).tolist() for name, value in series.items()}
        return [
            {
                "metrics": {name: values[row] for name, values in metrics.items()},
                "prediction": "",
                "new_tokens": (n_turns - 1) * self.tokens_per_turn,
                "prefill_len": self.tokens_per_turn,
                "budget": self.budget,
                "cache_len_final": final,
                # One head, evicting physically: every entry held is seen.
                "kv_entries_final": float(final),
                "kv_entries_held": float(final),
                "max_cache_len": trace.max_step_cache_len,
                "kv_bytes_final": final * entry_bytes,
                "kv_bytes_full": n_turns * self.tokens_per_turn * entry_bytes,
                "latency_s": latency_s,
                "decode_s": trace.total_s / n,
                "score_s": trace.method_s / n,
                "batch": n,
                "world": self.reading,
                "turns": {name: values[row] for name, values in rounded.items()},
            }
            for row in range(n)
        ]

    def run_example(self, policy: CachePolicy, example: Example) -> dict[str, Any]:
        """One dialog, one head: the harness's per-example record."""
        dialogs = make_dialogs(self.world, SCHEDULES[self.schedule][example.meta["scenario"]], [example.meta["index"]])
        trace = self.simulate(policy, dialogs)
        return self._outcomes(dialogs, trace, trace.method_s / dialogs.scenario.n_turns)[0]

    def run_batches(self, policy: CachePolicy, examples: list[Example]) -> Iterator[list[tuple[Example, dict]]]:
        """Up to ``batch_size`` dialogs of one scenario at a time, yielded together (one write).

        Each batch's latency is that of its first dialog run alone (``_latency``).
        """
        for scenario, group in groupby(examples, key=lambda example: example.meta["scenario"]):
            chosen = list(group)
            for start in range(0, len(chosen), self.batch_size):
                batch = chosen[start : start + self.batch_size]
                indices = [example.meta["index"] for example in batch]
                latency = self._latency(policy, scenario, indices[0])
                dialogs = _drawn(self.world, SCHEDULES[self.schedule][scenario], tuple(indices))
                outcomes = self._outcomes(dialogs, self.simulate(policy, dialogs), latency)
                yield list(zip(batch, outcomes, strict=True))

    def evaluate(
        self,
        policy: CachePolicy,
        scenarios: list[str] | None = None,
        n: int | None = None,
        batch_size: int | None = None,
    ) -> pd.DataFrame:
        """Per-dialog metrics of ``policy`` over ``scenarios`` (``n`` dialogs each), batched.

        Dialogs run ``batch_size`` at a time (all at once by default) as KV heads of one layer.
        ``frame.attrs`` holds ``method_s`` and ``total_s`` per scenario and the largest
        per-step cache length seen (``max_step_cache_len``).
        """
        n = self.n_dialogs if n is None else n
        rows: list[pd.DataFrame] = []
        attrs: dict[str, Any] = {"method_s": {}, "total_s": {}, "max_step_cache_len": 0}
        for scenario in scenarios or self.scenarios:
            size = batch_size or n
            for start in range(0, n, size):
                indices = list(range(start, min(start + size, n)))
                dialogs = self.dialogs(scenario, indices)
                started = time.perf_counter()
                trace = self.simulate(policy, dialogs)
                latency = trace.method_s / dialogs.scenario.n_turns
                metrics = {k: v.numpy() for k, v in self._metrics(dialogs, trace, latency).items()}
                rows.append(pd.DataFrame({"scenario": scenario, "index": indices, **metrics}))
                attrs["method_s"][scenario] = attrs["method_s"].get(scenario, 0.0) + trace.method_s
                attrs["total_s"][scenario] = attrs["total_s"].get(scenario, 0.0) + time.perf_counter() - started
                attrs["max_step_cache_len"] = max(attrs["max_step_cache_len"], trace.max_step_cache_len)
        out = pd.concat(rows, ignore_index=True)
        out.attrs.update(attrs)
        return out
