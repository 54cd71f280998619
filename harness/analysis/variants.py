"""Method variants: a method's name plus the parameters that differ from its named config.

A variant is read from each run's resolved ``config.yaml``: e.g. ``inertia[aggregator.alpha=0.5]``
or ``tova[aggregator=ema, scorer=keydiff]``; a default named method is just its name. Tables
select variants by that label, so an alpha sweep never leaks into the InertiaKV row of a
baseline table.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import pandas as pd
import yaml
from omegaconf import OmegaConf

from harness.config import CONF_DIR, compose_config
from harness.record.schema import flatten

#: How the papers name the methods; a variant keeps its parameter suffix after the name.
LABELS: dict[str, str] = {
    "full": "Full cache",
    "streaming_llm": "StreamingLLM",
    "h2o": "H2O",
    "tova": "TOVA",
    "tova_decode": "TOVA (decode-time)",
    "snapkv": "SnapKV",
    "inertia": "InertiaKV",
    "inertia_lazy": "InertiaKV Lazy-4",
    "score_free": "Score-Free",
    "cumulative": "Cumulative",
    "single_step": "Single-step",
    "inertia_reserve": "InertiaKV + static reserve",
    "inertia_rescue": "InertiaKV + first-eviction rescue",
    "inertia_aux": "Auxiliary (reserve + rescue)",
    "inertia_adaptive": "Adaptive α",
    "inertia_reactive": "Reactive trigger",
    "fixed_budget": "Fixed budget",
    "adakv_ea": "AdaKV+EA",
    "kvzip": "KVzip",
    "kvzip_mask": "KVzip (mask)",
    "keydiff": "KeyDiff",
    "bilinear": "Learned bilinear",
    "fdkvc": "FD-KVC",
    "fifo": "FIFO",
    "sink_window": "Sink(4)+Window",
    "kvpop": "KVpop",
    "kvpop_mlp": "KVpop (MLP)",
    "kvpop_immediate": "KVpop (no delay)",
    "dms": "DMS",
    "streaming_llm_plus": "StreamingLLM+",
}

# Keys of a method config that never distinguish variants: the name is the variant's stem,
# and selection.rho (KVpop's: rho) is the run's rho (an interpolation), already an identity column.
# A learned scorer's model and checkpoint follow the run's model (their defaults interpolate
# model.name): the model is an identity column and the checkpoint's digest is in the run id, so
# the learned bilinear scorer is one variant per model. The same holds for KVpop's trained rows
# (checkpoint, model, weights: the row's folder for the run's model and budget), so a row is its
# name and budget, kvpop[budget_tokens=96], and a traced run of it is another variant
# (kvpop[budget_tokens=96, pattern_tail=112, recall_queries=16]).
_NOT_PARAMS = frozenset(
    {"name", "selection.rho", "rho", "scorer.model", "scorer.checkpoint", "checkpoint", "model", "weights"}
)

Where = Mapping[str, Any]


@cache
def _option_names() -> dict[str, str]:
    """``_target_`` of every scorer/aggregator option -> its option name (``keydiff``, ``ema``)."""
    names: dict[str, str] = {}
    for group in ("scorer", "aggregator"):
        for path in sorted((CONF_DIR / "method" / group).glob("*.yaml")):
            target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
            if target:
                names[target] = path.stem
    return names


def _short(target: str) -> str:
    # The option name a user types (method/scorer=keydiff) reads better than a class path.
    return _option_names().get(target, target.rsplit(".", 1)[-1].lower())


def flatten_method(method: Mapping[str, Any]) -> dict[str, Any]:
    """A method config as ``{dotted key: value}``; a nested ``_target_`` becomes its option name.

    ``{"scorer": {"_target_": "...KeyDiffScorer"}, "aggregator": {"_target_": "...EMA", "alpha": 0.8}}``
    gives ``{"scorer": "keydiff", "aggregator": "ema", "aggregator.alpha": 0.8}``.
    """
    flat: dict[str, Any] = {}
    for key, value in flatten({k: v for k, v in method.items() if k != "_target_"}).items():
        if key.endswith("._target_"):
            flat[key.removesuffix("._target_")] = _short(str(value))
        else:
            flat[key] = value
    return {k: v for k, v in flat.items() if k not in _NOT_PARAMS}


@cache
def named_defaults(name: str) -> dict[str, Any] | None:
    """The flattened named config ``conf/method/<name>.yaml`` (do not modify: cached); None for a name without one."""
    if not (CONF_DIR / "method" / f"{name}.yaml").is_file():
        return None
    method = compose_config(f"method={name}", "rho=0").method

    return flatten_method(OmegaConf.to_container(method, resolve=True))


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def variant(name: str, params: Mapping[str, Any] | None = None) -> str:
    """The variant label of method ``name`` with ``params`` (dotted keys) set on its named config.

    Only parameters that differ from the named config enter the label, so
    ``variant("inertia", {"aggregator.alpha": 0.8}) == "inertia"``.
    """
    defaults = named_defaults(name) or {}
    chosen = {**defaults, **(params or {})}
    differing = sorted(k for k in chosen if _fmt_value(chosen[k]) != _fmt_value(defaults.get(k, _MISSING)))
    if not differing:
        return name
    return f"{name}[{', '.join(f'{k}={_fmt_value(chosen[k])}' for k in differing)}]"


_MISSING = object()


def display(label: str) -> str:
    """A variant label with the paper's method name: ``InertiaKV [aggregator.alpha=0.5]``."""
    name, bracket, rest = label.partition("[")
    return LABELS.get(name, name) + (f" [{rest}" if bracket else "")


def annotate(frame: pd.DataFrame, configs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``frame`` with a ``variant`` label and a ``p.<key>`` column per method parameter.

    A run without a config (copied records only) keeps its method name and hash as variant,
    so it never silently stands in for the named default. A ``diagnostics=true`` run carries
    ``diagnostics=True`` in its label (its timings differ), so it never stands in for a plain run.
    """
    frame = frame.copy()
    labels: dict[str, str] = {}
    params: dict[str, dict[str, Any]] = {}
    for run_id, method, method_hash in (
        frame[["run_id", "method", "method_params"]].drop_duplicates().itertuples(index=False)
    ):
        config = (configs.get(run_id) or {}).get("method")
        if config is None:
            labels[run_id] = f"{method}#{method_hash}"
            params[run_id] = {}
            continue
        flat = flatten_method(config)
        if (configs.get(run_id) or {}).get("diagnostics"):
            flat["diagnostics"] = True
        params[run_id] = flat
        labels[run_id] = variant(method, flat) if named_defaults(method) is not None else f"{method}#{method_hash}"
    frame["variant"] = frame["run_id"].map(labels)
    for key in sorted({k for p in params.values() for k in p}):
        frame[f"p.{key}"] = frame["run_id"].map(lambda r, key=key: params[r].get(key))
    return frame
