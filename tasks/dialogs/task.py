"""``task=dialogs``: the FD-KVC paper's synthetic dialog world as a task (no model loaded).

Each example is one dialog (``topic_shift/0007``); ``run_example`` runs a cache policy (an
eviction method as the harness adapts it, ``tasks.dialogs.policy``) through it and returns its
metrics.
``evaluate`` runs whole scenarios batched (all dialogs of a scenario side by side) for scripts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
import torch

from tasks.base import Example, Task, TaskProtocol, as_list, require_int, require_number
from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.simulate import Trace, adaptation, simulate
from tasks.dialogs.world import SCENARIOS, Dialogs, WorldConfig, make_dialogs, projections


@dataclass
class DialogTask(Task):
    """Synthetic multi-turn dialogs with topic dynamics (the FD-KVC paper's benchmark, arXiv 2608.18098).

    Parameters:
        scenarios: subset of ``topic_shift``, ``topic_return``, ``mixed``, ``complex``, ``gradual``.
        n_dialogs: dialogs per scenario (600).
        seed: seed of the head's projections and of every dialog.
        budget: cache entries kept (56).
        tokens_per_turn: tokens per turn (32).
        dim, head_dim: embedding (64) and head (16) sizes.
        topic_scale: topic weight in a token (0.8).
        noise_var: variance of each noise coordinate (0.05; see ``WorldConfig``).
        tied_qk: ``W_K = W_Q`` (off: the paper's independent projections).
        weight_std: std of the projection entries (None: ``1/sqrt(dim)``, N(0, 1/64)); larger
            values sharpen the head's attention (logits scale with its square).
        retention_threshold: cosine above which a cached token counts as on-topic (0.3).
        adaptation_threshold: retention that counts as adapted after a shift (0.8).
        late_turns: turns averaged by the "late" metrics (3).
    """

    name: ClassVar[str] = "dialogs"

    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    n_dialogs: int = 600
    seed: int = 0
    budget: int = 56
    tokens_per_turn: int = 32
    dim: int = 64
    head_dim: int = 16
    topic_scale: float = 0.8
    noise_var: float = 0.05
    tied_qk: bool = False
    weight_std: float | None = None
    retention_threshold: float = 0.3
    adaptation_threshold: float = 0.8
    late_turns: int = 3

    def __post_init__(self) -> None:
        self.scenarios = as_list("scenarios", self.scenarios)
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            named = f"names an unknown scenario {unknown[0]!r}" if unknown else "is empty"
            raise ValueError(f"task.scenarios={self.scenarios!r} {named} — choose from {', '.join(SCENARIOS)}")
        integers = {"n_dialogs": 600, "budget": 56, "tokens_per_turn": 32, "dim": 64, "head_dim": 16, "late_turns": 3}
        for option, example in integers.items():
            require_int(option, getattr(self, option), example=example)
        require_int("seed", self.seed, minimum=None, example=0)
        require_number("noise_var", self.noise_var, 0.05, minimum=0.0)
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

    def identity(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        for selecting in ("scenarios", "n_dialogs"):
            fields.pop(selecting)
        return fields

    def examples(self, tokenizer: Any = None) -> list[Example]:
        out = []
        for scenario in self.scenarios:
            spec = SCENARIOS[scenario]
            for index in range(self.n_dialogs):
                out.append(
                    Example(
                        example_id=f"{scenario}/{index:04d}",
                        subtask=scenario,
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
            self._last_dialogs = (key, make_dialogs(self.world, SCENARIOS[scenario], indices))
        return self._last_dialogs[1]

    def _metrics(self, dialogs: Dialogs, trace: Trace) -> dict[str, torch.Tensor]:
        late = slice(-self.late_turns, None)
        speed, never = adaptation(trace.retention, dialogs.scenario.shifts(), self.adaptation_threshold)
        n_turns = dialogs.scenario.n_turns
        per_turn_s = trace.method_s / (len(dialogs) * n_turns)
        return {
            "alignment": trace.alignment[:, late].mean(dim=1),
            "retention": trace.retention[:, late].mean(dim=1),
            "diversity": trace.diversity[:, late].mean(dim=1),
            "adaptation": speed.mean(dim=1) if speed.shape[1] else torch.full((len(dialogs),), float("nan")),
            "adaptation_never": never.float().mean(dim=1) if never.shape[1] else torch.zeros(len(dialogs)),
            "latency_ms_per_turn": torch.full((len(dialogs),), 1e3 * per_turn_s),
        }

    def run_example(self, policy: CachePolicy, example: Example) -> dict[str, Any]:
        """One dialog, one head: the harness's per-example record."""
        scenario = SCENARIOS[example.subtask]
        dialogs = make_dialogs(self.world, scenario, [example.meta["index"]])
        trace = simulate(policy, dialogs, self.heads, self.budget, self.retention_threshold, self.seed)
        metrics = {name: float(value[0]) for name, value in self._metrics(dialogs, trace).items()}
        # One entry holds a key and a value of head_dim float32 numbers.
        entry_bytes = 2 * self.head_dim * 4
        n_tokens = scenario.n_turns * self.tokens_per_turn
        return {
            "metrics": metrics,
            "prediction": "",
            "new_tokens": example.max_new_tokens,
            "prefill_len": self.tokens_per_turn,
            "budget": self.budget,
            "cache_len_final": int(trace.cache_len[-1]),
            "max_cache_len": trace.max_step_cache_len,
            "kv_bytes_final": int(trace.cache_len[-1]) * entry_bytes,
            "kv_bytes_full": n_tokens * entry_bytes,
            "latency_s": trace.method_s,
            "decode_s": trace.total_s,
            "score_s": trace.method_s,
            "turns": {
                "alignment": [round(float(v), 5) for v in trace.alignment[0]],
                "retention": [round(float(v), 5) for v in trace.retention[0]],
                "diversity": [round(float(v), 5) for v in trace.diversity[0]],
            },
        }

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
                trace = simulate(policy, dialogs, self.heads, self.budget, self.retention_threshold, self.seed)
                metrics = {k: v.numpy() for k, v in self._metrics(dialogs, trace).items()}
                frame = pd.DataFrame({"scenario": scenario, "index": indices, **metrics})
                rows.append(frame)
                attrs["method_s"][scenario] = attrs["method_s"].get(scenario, 0.0) + trace.method_s
                attrs["total_s"][scenario] = attrs["total_s"].get(scenario, 0.0) + trace.total_s
                attrs["max_step_cache_len"] = max(attrs["max_step_cache_len"], trace.max_step_cache_len)
        out = pd.concat(rows, ignore_index=True)
        out.attrs.update(attrs)
        return out
