"""Composing ``conf/`` outside the run's own composition (presets, benchmarks, notebooks, tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

# The config's resolvers are registered there, for every composition.
from harness import errors  # noqa: F401
from harness.models import ModelSpec

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
#: ``scale=``: the size of a ``conf/experiment`` preset, whose ``forms.<scale>`` block holds
#: what differs between the paper's form (``cluster``) and the CPU one (``cpu``).
SCALES = ("cluster", "cpu")


def experiment_preset(path: str) -> dict[str, Any]:
    """A ``conf/experiment`` preset as written (raw YAML, not composed): its forms and sweep, for the analysis."""
    return yaml.safe_load((CONF_DIR / "experiment" / path).read_text()) or {}


def compose_config(*overrides: str, config_name: str = "config") -> DictConfig:
    """The config ``python -m harness.run <overrides>`` would run with.

    Inside a Hydra application (a running ``harness.run`` job) the application's own config
    search path serves; elsewhere ``conf/`` is read directly.
    """
    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def model_spec(name: str) -> ModelSpec:
    """The spec of ``conf/model/<name>.yaml``."""
    return ModelSpec.from_config(compose_config(f"model={name}").model)
