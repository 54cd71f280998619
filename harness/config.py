"""The config: composing ``conf/`` outside the run's own composition (presets, benchmarks, notebooks,
tests), and the checks of a composed config's own options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

# The config's resolvers are registered there, for every composition.
from harness import errors  # noqa: F401
from harness.decode.engine import NUMERICS
from harness.decode.sampling import Sampling
from harness.models import ModelSpec, resolve_device
from harness.options import check_appended, check_fields, is_int
from harness.record.schema import canonical_rho
from methods.selection import check_rho

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


def resolve_numerics(numerics: int | str, device: torch.device) -> int | str:
    """A run's ``numerics`` on ``device``: ``auto`` is 4 on CUDA, where a step's kernel count sets its pace and no
    record was made before it, and the reference (1) elsewhere, where every record so far was made under it."""
    if numerics == "auto":
        return 4 if device.type == "cuda" else 1
    return numerics


def check_top_level(cfg: DictConfig) -> None:
    """Refuse a malformed top-level option: rho, scale, seed, threads, batch_size, numerics, diagnostics,
    profile, sampling.

    rho becomes a float here, so ``rho=0`` and ``rho=0.0`` are one run everywhere downstream; ``numerics=auto``
    becomes its value on the model's device (``resolve_numerics``), so the run id and the saved config name it.
    """
    check_rho(cfg.rho)
    cfg.rho = canonical_rho(cfg.rho)
    if cfg.scale not in SCALES:
        raise ValueError(f"scale={cfg.scale!r} is not a scale — use scale=cluster or scale=cpu")
    if not is_int(cfg.seed):
        raise ValueError(f"seed={cfg.seed!r} is not an integer — use e.g. seed=0")
    if cfg.threads is not None and not (is_int(cfg.threads) and cfg.threads >= 1):
        raise ValueError(f"threads={cfg.threads!r} is not a positive integer — use e.g. threads=1, or threads=null")
    for switch in ("diagnostics", "profile"):
        if not isinstance(cfg[switch], bool):
            raise ValueError(f"{switch}={cfg[switch]!r} is not true or false — use {switch}=true or {switch}=false")
    if not (is_int(cfg.batch_size) and cfg.batch_size >= 1):
        raise ValueError(f"batch_size={cfg.batch_size!r} is not a positive integer — use e.g. batch_size=8")
    cfg.numerics = resolve_numerics(cfg.numerics, resolve_device(cfg.model.device))
    if cfg.numerics not in NUMERICS:
        raise ValueError(
            f"numerics={cfg.numerics!r} is not auto or one of {', '.join(map(str, NUMERICS))} — use numerics=auto"
            " (4 on a GPU, 1 elsewhere), numerics=1 (the reference) or numerics=2, 3 or 4 (fewer kernels a step)"
        )
    if cfg.diagnostics and cfg.batch_size > 1:
        raise ValueError(
            f"diagnostics=true traces one sequence at a time and batch_size={cfg.batch_size} decodes several"
            " — use batch_size=1 with diagnostics"
        )
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    unknown = sorted(set(sampling) - {field.name for field in dataclasses.fields(Sampling)})
    if unknown:
        raise ValueError(f"sampling.{unknown[0]} is not a sampling option — use temperature, top_k or top_p")
    Sampling(**sampling)


def check_options(cfg: DictConfig, overrides: list[str] | None) -> None:
    """Refuse an option nothing reads: an appended top-level key, a key its node's class does not take.

    ``overrides`` are the command line's (None where they are not known).
    """
    if overrides is not None:
        base = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
        keys = [k for k in base if k != "defaults"]
        keys += [next(iter(entry)) for entry in base["defaults"] if isinstance(entry, dict)]
        check_appended(overrides, cfg, keys, [path.name for path in CONF_DIR.iterdir() if path.is_dir()])
    check_fields(cfg.task, "task")
    check_fields(cfg.method, "method")
