"""Where a result came from: code version, packages, hardware."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

PACKAGES = (
    "torch",
    "transformers",
    "datasets",
    "hydra-core",
    "omegaconf",
    "numpy",
    "rouge-score",
    "evictbench",
)


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} torch threads)"


def collect(device: torch.device) -> dict[str, Any]:
    """A provenance entry for one session of a run."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "packages": {name: _version(name) for name in PACKAGES},
        "python": sys.version.split()[0],
        "device": device_description(device),
        "host": socket.gethostname(),
        "argv": sys.argv,
    }
