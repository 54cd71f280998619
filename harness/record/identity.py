"""What a run is: the identity a run id is computed from, and the run folders of older identities.

``identify`` turns a composed config into a ``RunId`` (``harness.record.schema`` owns its format) and
the ``Identity`` every record carries in full. Everything that changes an output is in it:

- the model's outputs-relevant fields on its device, and the batch size when it is above 1:
  a matrix product over several rows sums in another order than over one, so a batched
  sequence's logits, scores and in principle its tokens differ in their last bits from batch
  1's (a near-tie in a keep set can flip). Batch 1 adds nothing, so its ids are unchanged;
- the engine's ``numerics`` when it is not the reference (1), ``auto`` as its device takes it, for the same
  reason;
- every method parameter, a checkpoint file's content, the diagnostics and profile switches;
- the task's protocol (local data files by their content, ``tasks.digest``), and sampling
  when it is not greedy; rho and the seed have their own parts.

A rule that changes (``SCHEMA_VERSION`` in ``harness.record.schema``) moves runs to new folders. The
folder under the old rule is not left behind silently: ``older_folders`` finds it (the same
model, method, task, rho and seed, whose records predate the rule and whose saved config,
re-identified under today's rule, names this run) so the run refuses to start beside it and
names the command that re-identifies it (``python -m harness.record.migrate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from harness.config import model_spec, resolve_numerics
from harness.models import ModelSpec, resolve_device
from harness.record.files import read_first_record, read_records
from harness.record.schema import SCHEMA_VERSION, RunId, canonical_rho, digest, flatten, format_rho
from tasks.base import Task, TaskProtocol
from tasks.digest import file_sha256

#: The command that re-identifies run folders made under an older rule.
MIGRATE = "python -m harness.record.migrate"


def _method_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as hashed: without ``rho`` (a method's rho is the run's, which the run id holds once), and
    with ``<key>_sha256`` beside every ``checkpoint``-named field that points at a file."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "rho":
            continue
        out[key] = _method_params(value) if isinstance(value, dict) else value
        if key.endswith("checkpoint") and isinstance(value, str) and Path(value).is_file():
            out[f"{key}_sha256"] = file_sha256(value)
    return out


@dataclass
class Identity:
    """What a run id is computed from, kept in full in every record and in provenance.

    Parameters:
        model: the model's outputs-relevant fields on its device (``ModelSpec.identity``), plus
            ``batch_size`` above 1 and ``numerics`` above 1; empty for tasks that need no model.
        model_variant: what of those differs from the preset on a CPU at batch 1 (hashed into the run id).
        method: every method parameter, checkpoint digests, the diagnostics and profile switches.
        task: the task's protocol, plus sampling when not greedy.
    """

    model: dict[str, Any]
    model_variant: dict[str, Any]
    method: dict[str, Any]
    task: dict[str, Any]

    def fields(self) -> dict[str, Any]:
        return {"model": self.model, "method": self.method, "task": self.task}


def identify(cfg: DictConfig, task: Task, spec: ModelSpec | None) -> tuple[RunId, Identity]:
    """The run id of ``cfg`` and what it is computed from (``harness.record.schema`` has the format).

    ``cfg.rho`` is made canonical first, so the method parameters that interpolate it agree with the record.
    """
    cfg.rho = canonical_rho(cfg.rho)
    method = _method_params(OmegaConf.to_container(cfg.method, resolve=True))
    method.pop("name", None)
    if cfg.diagnostics:
        method["diagnostics"] = True
    if cfg.get("profile"):
        method["profile"] = True
    sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
    task_identity = dict(task.identity())
    if sampling["temperature"] > 0:
        task_identity["sampling"] = sampling
    if spec is None:
        identity = Identity({}, {}, method, task_identity)
        model_name = "world"
    else:
        device = resolve_device(spec.device)
        variant = spec.differences(model_spec(spec.name), device)
        model = spec.identity(device)
        if cfg.batch_size > 1:
            variant["batch_size"] = model["batch_size"] = cfg.batch_size
        numerics = resolve_numerics(cfg.numerics, device)
        if numerics != 1:
            variant["numerics"] = model["numerics"] = numerics
        identity = Identity(model, variant, method, task_identity)
        model_name = spec.name
    run = RunId(
        model=model_name,
        model_params=digest(identity.model_variant) if identity.model_variant else None,
        method=cfg.method.name,
        method_params=digest(method),
        task=task.name,
        task_params=digest(task_identity),
        rho=format_rho(cfg.rho),
        seed=str(cfg.seed),
    )
    return run, identity


def run_id(cfg: DictConfig, task: Task) -> str:
    """The run id ``cfg`` runs under."""
    spec = None if task.protocol is TaskProtocol.WORLD else ModelSpec.from_config(cfg.model)
    return str(identify(cfg, task, spec)[0])


#: Classes that moved since a saved config named them (schema version 3: the aggregators got a folder).
MOVED_TARGETS = {
    "methods.aggregation.SingleStep": "methods.aggregators.single_step.SingleStep",
    "methods.aggregation.Cumulative": "methods.aggregators.cumulative.Cumulative",
    "methods.aggregation.EMA": "methods.aggregators.ema.EMA",
    "methods.adaptive_alpha.AdaptiveEMA": "methods.aggregators.adaptive.AdaptiveEMA",
    "methods.reactive_alpha.ReactiveEMA": "methods.aggregators.reactive.ReactiveEMA",
}


def _moved(node: Any) -> Any:
    """``node`` with every ``_target_`` of a moved class replaced by today's path."""
    if isinstance(node, dict):
        return {k: MOVED_TARGETS.get(v, v) if k == "_target_" else _moved(v) for k, v in node.items()}
    return [_moved(item) for item in node] if isinstance(node, list) else node


def saved_config(folder: Path) -> DictConfig:
    """The resolved config a run folder was last run with, as today's code reads it: moved classes under
    their new paths, rho in its canonical form."""
    cfg = OmegaConf.create(_moved(OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))))
    cfg.rho = canonical_rho(cfg.rho)
    cfg.setdefault("batch_size", 1)
    cfg.setdefault("numerics", 1)
    return cfg


def reidentify(folder: Path, batch_size: int) -> tuple[RunId, Identity]:
    """The run id and identity of ``folder``'s runs at ``batch_size``, under today's rules, from its ``config.yaml``."""
    cfg = saved_config(folder)
    cfg.batch_size = batch_size
    task: Task = instantiate(cfg.task)
    spec = None if task.protocol is TaskProtocol.WORLD else ModelSpec.from_config(cfg.model)
    return identify(cfg, task, spec)


def record_version(record: dict[str, Any]) -> int:
    """The schema version a record was written under (1: before records carried one)."""
    return int(record.get("schema_version", 1))


def older_folders(results: Path, run: RunId) -> list[Path]:
    """Run folders under ``results`` made under an older rule whose records belong to ``run`` today.

    Only folders of the same model, method, task, rho and seed whose first record predates
    ``SCHEMA_VERSION`` are re-identified (from their ``config.yaml``), so a large results root costs
    a directory listing and a few reads.
    """
    found = []
    for folder in sorted(results.glob("*/records.jsonl")):
        folder = folder.parent
        if folder.name == str(run) or folder.name.startswith("."):
            continue
        try:
            other = RunId.parse(folder.name)
        except ValueError:
            continue
        if (other.model, other.method, other.task, other.seed) != (run.model, run.method, run.task, run.seed):
            continue
        if canonical_rho(float(other.rho)) != canonical_rho(float(run.rho)):
            continue
        first = read_first_record(folder / "records.jsonl")
        if first is None or record_version(first) >= SCHEMA_VERSION or not (folder / "config.yaml").is_file():
            continue
        if str(run) in {str(reidentify(folder, size)[0]) for size in batch_sizes(folder)}:
            found.append(folder)
    return found


def batch_sizes(folder: Path) -> set[int]:
    """The batch sizes the records of ``folder`` were decoded at (1 before records said)."""
    return {int((r.get("meta") or {}).get("batch_size", 1)) for r in read_records(folder / "records.jsonl")} or {1}


def check_recorded(records: list[dict[str, Any]], identity: Identity, batch_size: int, path: Path) -> None:
    """Refuse to add records to ``path`` when the records it holds came from another identity.

    An older record (schema version below today's) made under the same identity and batch size
    is read as it is; any other difference means the folder belongs to another run under
    today's rules (``python -m harness.record.migrate`` moves it there), or that a preset was edited.
    """
    for record in records:
        recorded = record.get("identity")
        older = record_version(record) < SCHEMA_VERSION
        decoded_at = (record.get("meta") or {}).get("batch_size", 1)
        if recorded is None or (recorded == identity.fields() and (not older or decoded_at == batch_size)):
            continue
        if older:
            raise ValueError(
                f"{path} holds records of schema version {record_version(record)}, which today's rules"
                f" (version {SCHEMA_VERSION}) give another run id — re-identify them with"
                f" `{MIGRATE} {path.parent.parent}`, or move that folder away"
            )
        mine, theirs = flatten(identity.fields()), flatten(recorded)
        key = next(k for k in sorted(mine.keys() | theirs.keys()) if mine.get(k) != theirs.get(k))
        raise ValueError(
            f"{path} holds records made with {key}={theirs.get(key)!r}, this config has {mine.get(key)!r}"
            " (a preset changed since) — move that folder away to rerun, or restore the preset"
        )
