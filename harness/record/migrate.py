"""``python -m harness.record.migrate [results_dir] [--dry-run]``: re-identify run folders made under older rules.

When the rules of the run id change (``harness.record.schema.SCHEMA_VERSION``), a run of an unchanged
config gets another id, and ``harness.run`` refuses to start beside the folder of its older one.
This command moves such records to the folders today's rules name:

- each run folder whose records predate ``SCHEMA_VERSION`` is re-identified from its saved
  ``config.yaml`` (``harness.record.identity.reidentify``), once per batch size its records were
  decoded at (the batch size above 1 is part of the identity since version 2, so a folder that
  mixed batch sizes splits in two);
- every record keeps its content; ``schema_version``, ``run_id``, ``rho`` (a float) and
  ``identity`` are rewritten;
- records are appended to the target folder under its run lock, its summary is recomputed, the
  provenance lines follow with one more naming the migration, and diagnostics lines follow
  their records; the old folder is removed last, so a kill at any moment leaves every record
  in one of the two folders, and a rerun finishes the move (a record already moved is
  recognised and skipped);
- a record whose target already holds a different record of its example is a conflict: the
  folder is left as it is and the message says which folder to move away;
- a folder whose identity names local data files that changed after its records were made
  cannot be re-identified (their content then is unknown): it is left for the user to move away.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.errors import UserError, cli
from harness.record.files import RecordFile, RunLock, append_lines, encode, read_records, write_atomic
from harness.record.identity import batch_sizes, record_version, reidentify, saved_config
from harness.record.schema import RECORD_FIELDS, SCHEMA_VERSION, canonical_rho
from harness.record.summary import summarize

DIAGNOSTICS = "diagnostics.jsonl"


def _paths(value: Any) -> list[Path]:
    """Every string inside ``value`` that names an existing file or folder."""
    if isinstance(value, dict):
        return [path for item in value.values() for path in _paths(item)]
    if isinstance(value, list):
        return [path for item in value for path in _paths(item)]
    if isinstance(value, str) and ("/" in value or "." in value) and Path(value).exists():
        return [Path(value)]
    return []


def _first_session(folder: Path) -> datetime | None:
    path = folder / "provenance.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.strip():
            return datetime.fromisoformat(json.loads(line)["started_at"])
    return None


def _check_data_unchanged(folder: Path, record: dict[str, Any]) -> None:
    """Refuse a folder whose (older) ``record`` named data files by path that changed after its first session."""
    started = _first_session(folder)
    for path in _paths((record.get("identity") or {}).get("task", {})):
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        # The session's start is kept to the second: a file written earlier in that second is not a change.
        changed = [p for p in files if started is None or int(p.stat().st_mtime) > started.timestamp()]
        if changed:
            raise UserError(
                f"{folder}: its records read {path} by path, and {changed[0]} changed after they were made, so"
                " the content they came from is unknown — move the folder away and rerun the config"
            )


def migrated(record: dict[str, Any], run: str, identity: dict[str, Any]) -> dict[str, Any]:
    """``record`` under today's rules: the same content, its version, run id, rho and identity rewritten."""
    fields = {**record, "schema_version": SCHEMA_VERSION, "run_id": run, "identity": identity}
    if "rho" in fields:
        fields["rho"] = canonical_rho(fields["rho"])
    ordered = {name: fields.pop(name) for name in RECORD_FIELDS if name in fields}
    return {**ordered, **fields}


def _move(folder: Path, target: Path, records: list[dict[str, Any]], batch_size: int) -> int:
    """Put ``records`` (migrated) into ``target``; how many were new there."""
    with RunLock(target):
        existing = {r["example_id"]: r for r in read_records(target / "records.jsonl", repair=True)}
        fresh = []
        for record in records:
            there = existing.get(record["example_id"])
            if there is None:
                fresh.append(record)
            elif there != record:
                raise UserError(
                    f"{target} already holds another record of {record['example_id']!r} than {folder} — keep one run:"
                    f" move {folder} or {target} out of the results root, then run this again"
                )
        if fresh:
            append_lines(target / "records.jsonl", [encode(record) for record in fresh])
        if not (target / "config.yaml").is_file():
            cfg = saved_config(folder)
            cfg.batch_size = batch_size
            write_atomic(target / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        provenance = folder / "provenance.jsonl"
        if fresh and provenance.is_file():
            moved = {"migrated_from": folder.name, "run_id": target.name, "schema_version": SCHEMA_VERSION,
                     "at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
            history = [line + "\n" for line in provenance.read_text().splitlines() if line.strip()]
            append_lines(target / "provenance.jsonl", [line.encode() for line in history] + [encode(moved)])
        diagnostics = folder / DIAGNOSTICS
        if fresh and diagnostics.is_file():
            ids = {record["example_id"] for record in fresh}
            lines = [line for line in read_records(diagnostics) if line["example_id"] in ids]
            append_lines(target / DIAGNOSTICS, [encode(line) for line in lines])
        summary = summarize(RecordFile(target / "records.jsonl").records())
        summary["run_id"] = target.name
        write_atomic(target / "summary.json", json.dumps(summary, indent=2) + "\n")
    return len(fresh)


def migrate_folder(folder: Path, dry_run: bool = False) -> list[str]:
    """Re-identify one run folder; one line per target folder, empty when the folder is current."""
    records = read_records(folder / "records.jsonl")
    older = [r for r in records if record_version(r) < SCHEMA_VERSION]
    if not older:
        return []
    if not (folder / "config.yaml").is_file():
        raise UserError(f"{folder} has no config.yaml to re-identify its records from — move the folder away")
    _check_data_unchanged(folder, older[0])
    plan = []
    for size in sorted(batch_sizes(folder)):
        run, identity = reidentify(folder, size)
        mine = [r for r in records if int((r.get("meta") or {}).get("batch_size", 1)) == size]
        plan.append((folder.parent / str(run), size, [migrated(r, str(run), identity.fields()) for r in mine]))
    lines = []
    if dry_run:
        return [
            f"would {'rewrite ' + folder.name + ' in place' if target == folder else 'move ' + folder.name + ' -> '}"
            f"{'' if target == folder else target.name}: {len(moved)} records"
            for target, _, moved in plan
        ]
    with RunLock(folder) as lock:
        kept = []
        for target, size, moved in plan:
            if target == folder:
                kept = moved
                lines.append(f"{folder.name}: {len(moved)} records rewritten in place")
                continue
            count = _move(folder, target, moved, size)
            lines.append(f"{folder.name} -> {target.name}: {len(moved)} records ({count} new there)")
        if kept:
            write_atomic(folder / "records.jsonl", "".join(encode(r).decode("utf-8") for r in kept))
        else:
            (folder / "records.jsonl").unlink()
            lock.discard_unrecorded()
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.record.migrate", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", nargs="?", default="results", help="the results root (default: results)")
    parser.add_argument("--dry-run", action="store_true", help="print what would move, change nothing")
    args = parser.parse_args(argv)
    root = Path(args.results_dir)
    if not root.is_dir():
        raise UserError(
            f"{root} is not a folder — pass the results root, e.g. python -m harness.record.migrate results"
        )
    changed, conflicts = 0, 0
    for path in sorted(root.glob("*/records.jsonl")):
        if path.parent.name.startswith("."):
            continue
        # A folder that cannot move (a conflict, changed data) is reported and left; the others go on.
        try:
            lines = migrate_folder(path.parent, args.dry_run)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            conflicts += 1
            continue
        for line in lines:
            print(line)
        changed += bool(lines)
    done = "to re-identify" if args.dry_run else "re-identified"
    print(f"{changed} run folder(s) {done} under {root}, {conflicts} left as they were", file=sys.stderr)
    if conflicts:
        sys.exit(2)


if __name__ == "__main__":
    cli(main)
