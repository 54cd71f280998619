"""Loading hub datasets through ``datasets``: a pinned hub copy, or local files in the hub's schema."""

from __future__ import annotations

import functools
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import datasets


def utf8_text(path: Path, fix: str) -> str:
    """The text of ``path``; a byte that is not UTF-8 is refused naming the file, line and byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({error.reason} at byte {error.start}) — {fix}") from None


def check_json_file(path: Path) -> None:
    """Refuse an empty JSON or JSON-lines file, or one with a malformed line, naming the file and the line."""
    fix = "fix or delete that line, or download the file again"
    text = utf8_text(path, "save it as UTF-8, or download the file again")
    if not text.strip():
        raise ValueError(f"{path} is empty — point the task at a file that holds its rows, or download it again")
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


@functools.cache
def offline_unless_reachable() -> bool:
    """Put huggingface_hub and datasets in offline mode when the hub's host cannot be reached; True if so.

    Unreachable, every hub load spends about 24 s in huggingface_hub's retries before it fails, once
    per job of a sweep on nodes without network. Offline, a load reads the datasets cache and fails
    at once when the data is not there. Both libraries copy HF_HUB_OFFLINE into a module global at
    import, before any task runs, so the switch is made on those globals, here and nowhere else.
    Probed once per process.
    """
    import datasets.config
    import huggingface_hub.constants

    if huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE:
        return True
    url = urlsplit(huggingface_hub.constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=3).close()
        return False
    except OSError:
        huggingface_hub.constants.HF_HUB_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
        return True


def unavailable_reason(error: BaseException, offline: bool) -> str:
    """The first line of a failed hub load's error, and whether only the cache could be read."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if offline:
        reason += "; offline (HF_HUB_OFFLINE, or the hub cannot be reached), so only the datasets cache was read"
    return reason


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
    offline = offline_unless_reachable()
    try:
        return load_dataset(hub_id, name, data_dir=data_dir, revision=revision, split=split)
    except Exception as error:
        # datasets raises several unrelated types here (offline mode, no network, missing
        # repo or revision, a loading script it refuses to run); all mean "not available".
        where = f"{hub_id}@{revision}" + (f" ({name})" if name else "") + (f" data_dir={data_dir}" if data_dir else "")
        reason = unavailable_reason(error, offline)
        raise FileNotFoundError(
            f"could not load {where}, split {split!r}, from the hub ({reason}) — {how_to_get}"
        ) from error


def load_rows(hub_id: str, **fields: Any) -> list[dict[str, Any]]:
    """``load_split`` as a list of plain dicts."""
    return [dict(row) for row in load_split(hub_id, **fields)]
