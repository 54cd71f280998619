"""Optional experiment tracking (``logger=wandb``): one wandb run per harness job.

``records.jsonl`` stays the source of truth; wandb only mirrors it. A run is named after the
run id and carries the resolved config; every new record is one step (its primary metric and
the cache and speed figures), the run's summary goes in at the end, and the wandb run is
finished with exit code 1 when the job fails, so a crashed job never leaves a run open.
``logger=none`` (the default) does nothing and never imports wandb.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from omegaconf import DictConfig, OmegaConf

from harness.record.schema import NUMERIC_FIELDS


def step_values(record: dict[str, Any]) -> dict[str, float]:
    """What one record contributes to the history: primary metric, cache and speed figures."""
    name, value = next(iter(record["metrics"].items()))
    values = {f"metric/{name}": float(value)}
    values.update({name: record[name] for name in NUMERIC_FIELDS if isinstance(record.get(name), int | float)})
    if record.get("kv_bytes_full"):
        values["kv_ratio"] = record["kv_bytes_final"] / record["kv_bytes_full"]
    return values


class NullLogger:
    """``logger=none``: the same interface, nothing recorded."""

    def log_record(self, record: dict[str, Any], step: int) -> None:
        """Ignore one record."""

    def log_summary(self, summary: dict[str, Any]) -> None:
        """Ignore the summary."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class WandbLogger(NullLogger):
    """One wandb run, opened on ``__enter__`` and finished on ``__exit__`` (exit code 1 on error)."""

    def __init__(self, cfg: DictConfig, run_id: str) -> None:
        self.settings = OmegaConf.to_container(cfg.logger, resolve=True)
        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.run_id = run_id
        self.run: Any = None

    def __enter__(self) -> Self:
        try:
            wandb = importlib.import_module("wandb")
        except ImportError as error:
            raise ImportError(
                "logger=wandb needs the wandb package: pip install 'evictbench[wandb]' (or run with logger=none)"
            ) from error
        settings = self.settings
        Path(settings["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=settings["project"],
            entity=settings["entity"],
            group=settings["group"],
            tags=list(settings["tags"]),
            mode=settings["mode"],
            dir=settings["dir"],
            name=self.run_id,
            config=self.config,
        )
        return self

    def log_record(self, record: dict[str, Any], step: int) -> None:
        """One history step; ``step`` counts the run's records, so a resumed job continues the count."""
        self.run.log(step_values(record), step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        """The run's summary (``summary.json``) as the wandb summary."""
        self.run.summary.update(summary)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.run.finish(exit_code=0 if kind is None else 1)
        self.run = None


def open_logger(cfg: DictConfig, run_id: str) -> NullLogger:
    """The tracker ``cfg.logger`` names, to be used as ``with open_logger(cfg, run) as tracker:``."""
    name = cfg.get("logger", {}).get("name", "none")
    if name == "none":
        return NullLogger()
    if name == "wandb":
        return WandbLogger(cfg, run_id)
    raise ValueError(f"logger={name!r}: expected none or wandb")
