"""Shared fixtures: models built from ``conf/model`` exactly as ``harness.run`` builds them."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import instantiate

from harness.config import compose_config, model_spec
from harness.models import load_model, load_tokenizer

# Developer tooling the tests use (the local Slurm cluster) lives in scripts/, outside the packages.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

TINY_MODELS = ("tiny_llama", "tiny_qwen2", "tiny_qwen3", "tiny_mistral")
NAMED_METHODS = (
    "full",
    "streaming_llm",
    "h2o",
    "tova",
    "snapkv",
    "inertia",
    "inertia_lazy",
    "score_free",
    "cumulative",
    "single_step",
)


def refused(build: Callable[[], object], named: str, error: type[Exception] = ValueError) -> str:
    """The message of the error ``build()`` raises: a user's mistake, one line naming ``named`` and the fix."""
    with pytest.raises(error) as raised:
        build()
    message = str(raised.value)
    assert named in message and " — " in message and "\n" not in message, message
    return message


def assert_one_line(message: str) -> None:
    assert " — " in message and "\n" not in message, message


def named_method(name: str, *overrides: str):
    return instantiate(compose_config(f"method={name}", *overrides).method)


# scripts/gpu_check.sh runs the engine's tests on a GPU in bf16 with EVICTBENCH_TEST_DEVICE=cuda.
TEST_DEVICE = os.environ.get("EVICTBENCH_TEST_DEVICE", "cpu")


def tiny_spec(name: str):
    spec = model_spec(name)
    return spec if TEST_DEVICE == "cpu" else dataclasses.replace(spec, device=TEST_DEVICE, dtype="bfloat16")


def hub_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, offline: bool) -> None:
    """huggingface_hub and datasets in offline (or online) mode over an empty datasets cache, restored afterwards."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hub in offline mode over an empty datasets cache: every hub load fails at once."""
    hub_mode(monkeypatch, tmp_path, offline=True)


@pytest.fixture(scope="session")
def tiny_models() -> dict:
    return {name: load_model(tiny_spec(name)) for name in TINY_MODELS}


@pytest.fixture(scope="session")
def smollm2():
    spec = model_spec("smollm2_135m")
    return load_model(spec), load_tokenizer(spec)
