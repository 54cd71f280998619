"""Rank-trace diagnostics of decode-time eviction (InertiaKV's analysis: Table 13, App. H, Sec. 5.1).

``RetentionRecorder`` is an engine ``on_step`` hook. Per decode step it keeps the cached
positions before eviction, the method's raw per-step score over them (mean over layers and
heads, tapped from its scorer), the attention of the current query (the reference any scorer
is compared with), the method's aggregated state (``ScoredEviction.state``, token rows) and
the positions kept after eviction. The functions below turn those snapshots into per-step
series and per-example means:

- ``churn``: share of the previous step's retained set evicted at this step;
- ``churn_raw`` / ``churn_state``: the same for the top-k set by raw score / by aggregated
  state (Table 13's raw and EMA top-k churn);
- ``jaccard_raw_state``: Jaccard of the top-k by raw score and by aggregated state (raw/EMA);
- ``raw_top_evicted``: share of this step's raw top-k that the method evicted;
- ``spearman_vs_attention`` / ``jaccard_vs_attention``: rank correlation and top-B Jaccard of
  the method's scorer against last-query attention (mean over layers, every observed step);
- ``spearman_at_layer`` / ``jaccard_at_layer``: the same at one layer on the whole prompt at
  the first decode step, B = the budget (Sec. 5.1: layer 15, at a 10% budget, which the paper
  names for Llama-3.1-8B and Qwen2.5-7B alike; ``REFERENCE_LAYER``, the last layer of a model
  with fewer);
- ``boundary_margin``: the state gap between the B-th and (B+1)-th entries over the mean
  state, and ``score_entropy``: the normalised entropy of the raw scores (App. H's weaker
  observables of alpha sensitivity).

The paper's traces use "top-k" sets without giving k; over an evicting cache of B + 1
entries a top-B set can change by two entries at most, so k = ceil(TRACE_FRACTION * B): the
10% selectivity the budget itself applies to the prompt. Adaptive aggregators add what they
chose (``alpha_chosen``, ``eta``, ``trigger_rate``, ...) to the summary.

Output: one JSON line per example in ``results/<run id>/diagnostics.jsonl`` (identity, the
means, the series and, for small traces, the retained sets of layer 0 and the first step's
raw scores over the prompt for the figures), read back by ``harness.analysis.diagnostics``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats as scipy_stats
from torch import Tensor

from methods.aggregators.base import top_k
from methods.base import EvictionMethod, LayerView
from methods.overlap import jaccard
from methods.scorers.base import Scorer, group_mean

FILENAME = "diagnostics.jsonl"
#: Sec. 5.1's layer for the scorer correlations, on both of the paper's models (0-based, as the paper counts).
REFERENCE_LAYER = 15

#: Per-example means written under ``summary`` (and read into ``metric.<name>`` columns).
SUMMARY: tuple[str, ...] = (
    "churn",
    "churn_raw",
    "churn_state",
    "jaccard_raw_state",
    "raw_top_evicted",
    "spearman_vs_attention",
    "jaccard_vs_attention",
    "boundary_margin",
    "score_entropy",
)

#: Measured once per example at the first decode step (Sec. 5.1's scorer correlation).
FIRST_STEP: tuple[str, ...] = ("spearman_at_layer", "jaccard_at_layer")

#: The traced top-k: k = ceil(TRACE_FRACTION * B).
TRACE_FRACTION = 0.1

# Retained sets are written for the figures only while a trace holds at most this many
# positions in all (steps x budget): beyond that a line would weigh megabytes.
MAX_KEPT_POSITIONS = 200_000


# --------------------------------------------------------------------------- set and rank measures
def top_b(positions: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray, b: int) -> set[int]:
    """The ``b`` positions with the highest scores; ties go to the later (more recent) position."""
    positions = np.asarray(positions)
    scores = np.asarray(scores, dtype=float)
    # lexsort sorts by the last key first: score, then position, both descending after reversal.
    order = np.lexsort((positions, scores))[::-1]
    return {int(p) for p in positions[order[:b]]}


def churn(previous: set[int], current: set[int]) -> float:
    """Share of ``previous`` no longer in ``current``; NaN without a previous set."""
    return math.nan if not previous else len(previous - current) / len(previous)


def evicted_share(top: set[int], kept: set[int]) -> float:
    """Share of ``top`` that is not in ``kept``."""
    return math.nan if not top else len(top - kept) / len(top)


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(scipy_stats.spearmanr(x, y).statistic)


def boundary_margin(state: Sequence[float] | np.ndarray, budget: int) -> float:
    """(B-th largest - (B+1)-th largest state) / mean state; NaN when B entries or fewer are cached."""
    state = np.sort(np.asarray(state, dtype=float))[::-1]
    if state.size <= budget or state.mean() <= 0:
        return math.nan
    return float((state[budget - 1] - state[budget]) / state.mean())


def normalised_entropy(scores: Sequence[float] | np.ndarray) -> float:
    """Entropy of ``scores`` as a distribution over the entries, over log(entries); NaN without mass."""
    scores = np.clip(np.asarray(scores, dtype=float), 0.0, None)
    if scores.size < 2 or scores.sum() <= 0:
        return math.nan
    p = scores / scores.sum()
    nonzero = p[p > 0]
    return float(-(nonzero * np.log(nonzero)).sum() / math.log(scores.size))


@dataclass
class StepSnapshot:
    """One decode step as the recorder saw it.

    Parameters:
        step: decode step (1-based).
        positions: cached positions before eviction (layer 0, first KV head).
        kept: positions cached after eviction.
        raw: the scorer's score this step at ``positions`` (None on steps without observation).
        attention: last-query attention at ``positions`` (None when the engine computed none).
        state: the method's aggregated state at ``positions`` (None for methods without one).
    """

    step: int
    positions: np.ndarray
    kept: np.ndarray
    raw: np.ndarray | None = None
    attention: np.ndarray | None = None
    state: np.ndarray | None = None


def trace_series(steps: Sequence[StepSnapshot], budget: int, k: int | None = None) -> dict[str, list[float]]:
    """Per-step values of every ``SUMMARY`` measure (NaN where a step lacks the inputs).

    ``k`` is the size of the traced top sets (default: the budget); the comparison with
    attention and the boundary margin use the budget itself.
    """
    k = budget if k is None else k
    series: dict[str, list[float]] = {name: [] for name in SUMMARY}
    previous_kept: set[int] = set()
    previous_raw_top: set[int] = set()
    previous_state_top: set[int] = set()
    for snap in steps:
        kept = {int(p) for p in snap.kept}
        series["churn"].append(churn(previous_kept, kept))
        previous_kept = kept
        raw_top = top_b(snap.positions, snap.raw, k) if snap.raw is not None else set()
        state_top = top_b(snap.positions, snap.state, k) if snap.raw is not None and snap.state is not None else set()
        values = {
            "churn_raw": churn(previous_raw_top, raw_top) if raw_top else math.nan,
            "churn_state": churn(previous_state_top, state_top) if state_top else math.nan,
            "jaccard_raw_state": jaccard(raw_top, state_top) if raw_top and state_top else math.nan,
            "raw_top_evicted": evicted_share(raw_top, kept) if raw_top else math.nan,
            "spearman_vs_attention": math.nan,
            "jaccard_vs_attention": math.nan,
            "boundary_margin": boundary_margin(snap.state, budget) if state_top else math.nan,
            "score_entropy": normalised_entropy(snap.raw) if raw_top else math.nan,
        }
        if raw_top:
            previous_raw_top = raw_top
            if state_top:
                previous_state_top = state_top
            if snap.attention is not None:
                values["spearman_vs_attention"] = spearman(snap.raw, snap.attention)
                raw_budget = top_b(snap.positions, snap.raw, budget)
                values["jaccard_vs_attention"] = jaccard(raw_budget, top_b(snap.positions, snap.attention, budget))
        for name, value in values.items():
            series[name].append(value)
    return series


def summarize_series(series: dict[str, list[float]]) -> dict[str, float | None]:
    """Mean of each series over the steps where it is defined (None where it never is)."""
    out: dict[str, float | None] = {}
    for name, values in series.items():
        finite = [v for v in values if not math.isnan(v)]
        out[name] = float(np.mean(finite)) if finite else None
    return out


# --------------------------------------------------------------------------- recording
class _Tap(Scorer):
    """Wraps a method's scorer: returns its scores unchanged and hands them to the recorder.

    It also asks for the attention weights, so a scorer that does not read them (KeyDiff,
    key-norm) can still be compared with attention; that costs the weights' materialisation
    on observed steps, which is why diagnostics are a separate switch.
    """

    needs_attention = True  # type: ignore[misc]

    @property
    def order_free(self) -> bool:  # type: ignore[override]
        # The scores pass through unchanged, so they depend on the cache's order as the inner scorer's do.
        return self.inner.order_free

    def __init__(self, inner: Scorer, recorder: RetentionRecorder) -> None:
        self.inner = inner
        self.recorder = recorder

    def begin(self, info: Any) -> None:
        self.inner.begin(info)

    def score(self, view: LayerView) -> Tensor:
        scores = self.inner.score(view)
        self.recorder._observe(view, scores)
        return scores


@dataclass
class RetentionRecorder:
    """Engine ``on_step`` hook recording per-step retained sets, raw scores and method state.

    Use ``RetentionRecorder.attach(engine)``: it taps the method's scorer (if it has one) and
    installs itself as ``engine.on_step``. After each ``engine.generate``, ``finish(example_id,
    subtask)`` returns that sequence's diagnostics line (the harness appends it to
    ``diagnostics.jsonl`` just before the example's record) and clears the snapshots; step 0 (the
    prefill) also clears them, so every sequence starts fresh.
    """

    method: EvictionMethod
    steps: list[StepSnapshot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._raw: dict[int, list[float]] = {}
        self._attention: dict[int, list[float]] = {}
        self._first: dict[str, float] = {}
        self._reference: tuple[np.ndarray, np.ndarray] | None = None
        scorer = getattr(self.method, "scorer", None)
        if isinstance(scorer, Scorer) and not isinstance(scorer, _Tap):
            self.method.scorer = _Tap(scorer, self)

    @classmethod
    def attach(cls, engine: Any) -> RetentionRecorder:
        """A recorder for ``engine.method``, installed as ``engine.on_step``."""
        recorder = cls(engine.method)
        engine.on_step = recorder
        return recorder

    def _observe(self, view: LayerView, scores: Tensor) -> None:
        # One step's raw score: the mean over layers of the head-mean, per absolute position.
        positions = view.positions[0].tolist()
        raw = scores.float().mean(dim=0)
        self._add(self._raw, positions, raw.tolist())
        if view.weights is None:
            return
        attention = group_mean(view).mean(dim=0)
        self._add(self._attention, positions, attention.tolist())
        if not self.steps and view.layer == min(REFERENCE_LAYER, self.method.info.num_layers - 1):
            self._reference = (raw.cpu().numpy(), attention.float().cpu().numpy())

    def _first_step(self, positions: np.ndarray) -> None:
        """Sec. 5.1's scorer correlation at the reference layer, over the whole prompt (first step only)."""
        budget = self.method.budget()
        if self._reference is None or budget is None:
            return
        raw, attention = self._reference
        self._reference = None
        self._first = {
            "spearman_at_layer": spearman(raw, attention),
            "jaccard_at_layer": jaccard(top_b(positions, raw, budget), top_b(positions, attention, budget)),
        }

    @staticmethod
    def _add(bucket: dict[int, list[float]], positions: list[int], values: list[float]) -> None:
        for position, value in zip(positions, values, strict=True):
            bucket.setdefault(position, []).append(value)

    def _state(self, positions: np.ndarray) -> np.ndarray | None:
        state = getattr(self.method, "state", None)
        if not isinstance(state, Tensor):
            return None
        # Token granularity: one row shared by all layers; otherwise layer 0's first row.
        return state[0, 0, torch.as_tensor(positions, dtype=torch.long)].float().cpu().numpy()

    def __call__(self, step: int, context: Any, cache: object) -> None:
        if step == 0:
            self.steps.clear()
            self._raw.clear()
            self._attention.clear()
            self._first = {}
            return
        kept = context.positions[0][0].cpu().numpy()
        raw, attention = self._raw, self._attention
        self._raw, self._attention = {}, {}
        if raw:
            positions = np.array(sorted(raw))
            raw_values = np.array([np.mean(raw[p]) for p in positions])
            attention_values = np.array([np.mean(attention[p]) for p in positions]) if attention else None
            if not self.steps:
                self._first_step(positions)
        else:
            # A step without observation (Lazy-r, Score-Free): the cache before eviction is the
            # kept set of the last step plus the newest token.
            newest = self.method.info.prefill_len + step - 1
            previous = self.steps[-1].kept if self.steps else kept
            positions = np.union1d(previous, [newest])
            raw_values = attention_values = None
        self.steps.append(StepSnapshot(step, positions, kept, raw_values, attention_values, self._state(positions)))

    def finish(self, example_id: str, subtask: str | None = None) -> dict[str, Any]:
        """This sequence's diagnostics line; the snapshots are cleared."""
        budget = self.method.budget()
        steps, self.steps = self.steps, []
        line: dict[str, Any] = {"example_id": example_id, "subtask": subtask, "budget": budget, "steps": len(steps)}
        first, self._first = self._first, {}
        if budget is None:
            line["summary"] = {name: None for name in (*SUMMARY, *FIRST_STEP)}
            return line
        k = top_k(budget, TRACE_FRACTION)
        line["top_k"] = k
        series = trace_series(steps, budget, k)
        aggregator = getattr(self.method, "aggregator", None)
        chosen = aggregator.report() if aggregator is not None and hasattr(aggregator, "report") else {}
        finite = {name: None if value is None or math.isnan(value) else value for name, value in first.items()}
        line["summary"] = {**summarize_series(series), **{name: finite.get(name) for name in FIRST_STEP}, **chosen}
        line["series"] = {name: [None if math.isnan(v) else round(v, 5) for v in vs] for name, vs in series.items()}
        if sum(len(s.kept) for s in steps) <= MAX_KEPT_POSITIONS:
            line["kept"] = [s.kept.tolist() for s in steps]
            line["raw_top"] = [sorted(top_b(s.positions, s.raw, k)) if s.raw is not None else None for s in steps]
            if steps and steps[0].raw is not None:
                # The first step's raw score over the whole prompt: Figure 1 sorts its columns by it.
                line["first_scores"] = {"positions": steps[0].positions.tolist(), "raw": steps[0].raw.round(7).tolist()}
        return line
