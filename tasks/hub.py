"""Loading hub datasets through ``datasets``: a pinned hub copy, or local files in the hub's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets


def check_json_file(path: Path) -> None:
    """Refuse a JSON or JSON-lines file with a malformed line, naming the file and the line."""
    text = path.read_text(encoding="utf-8", errors="replace")
    fix = "fix or delete that line, or download the file again"
    if text.lstrip()[:1] == "[":
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}:{error.lineno}: not valid JSON ({error.msg}, column {error.colno}) — {fix}"
            ) from None
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error.msg}): {line[:60]!r} — {fix}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a JSON line must be an object, not {type(row).__name__} — {fix}")


def load_split(
    hub_id: str,
    *,
    split: str,
    revision: str | None,
    how_to_get: str,
    name: str | None = None,
    data_dir: str | None = None,
    local_file: Path | str | None = None,
) -> datasets.Dataset:
    """One split, from ``local_file`` (JSON, JSON lines or parquet in the hub's schema) when given, else the hub.

    A missing file, a malformed line or an unreachable hub raises with ``how_to_get`` after the
    dash, so the user learns exactly which repository, revision or file the task expects.
    """
    from datasets import load_dataset

    if local_file is not None:
        path = Path(local_file)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist — {how_to_get}")
        if path.suffix != ".parquet":
            check_json_file(path)
        builder = "parquet" if path.suffix == ".parquet" else "json"
        return load_dataset(builder, data_files={split: str(path)}, split=split)
    try:
        return load_dataset(hub_id, name, data_dir=data_dir, revision=revision, split=split)
    except Exception as error:
        # datasets raises several unrelated types here (offline mode, no network, missing
        # repo or revision, a loading script it refuses to run); all mean "not available".
        where = f"{hub_id}@{revision}" + (f" ({name})" if name else "") + (f" data_dir={data_dir}" if data_dir else "")
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(
            f"could not load {where}, split {split!r}, from the hub ({reason}) — {how_to_get}"
        ) from error


def load_rows(hub_id: str, **fields: Any) -> list[dict[str, Any]]:
    """``load_split`` as a list of plain dicts."""
    return [dict(row) for row in load_split(hub_id, **fields)]
