"""A local data file as part of a task's identity: its content, not its path.

A task's identity enters the run id, and a run resumes into the folder its id names. Were a
data file identified by its path, editing the file in place would resume the old run and mix
the records of two texts in one folder. So every local file or folder a task reads enters its
identity as the SHA-256 of what it holds (a folder: of every file's relative name and content),
and the path stays in the run's ``config.yaml`` and provenance. The same content at another
path is the same run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any


@cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path | str) -> str:
    """SHA-256 of a file's content, computed once per process for an unchanged file."""
    stat = Path(path).stat()
    return _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)


def content_digest(path: str | Path | None, option: str) -> str | None:
    """``sha256:<hex>`` of the file or folder ``path`` (``option`` names the setting); None stays None.

    A folder's digest covers the relative name and content of every file under it, hidden ones aside.
    """
    if path is None:
        return None
    where = Path(path)
    if where.is_file():
        return f"sha256:{file_sha256(where)}"
    if not where.is_dir():
        raise FileNotFoundError(f"{option}={str(path)!r} does not exist — point it at an existing file or folder")
    digest = hashlib.sha256()
    for file in sorted(where.rglob("*")):
        relative = file.relative_to(where)
        if file.is_file() and not any(part.startswith(".") for part in relative.parts):
            digest.update(f"{relative.as_posix()}\0{file_sha256(file)}\n".encode())
    return f"sha256-tree:{digest.hexdigest()}"


def content_digests(paths: Any, option: str) -> Any:
    """``paths`` (a path, or a mapping or list of them) with every path replaced by its ``content_digest``."""
    if isinstance(paths, Mapping):
        return {key: content_digests(value, f"{option}.{key}") for key, value in paths.items()}
    if isinstance(paths, list | tuple):
        return [content_digests(value, option) for value in paths]
    return content_digest(None if paths is None else str(paths), option)
