"""The per-example record file of a run: atomic appends, resumption, refusal of duplicates.

``records.jsonl`` holds one JSON object per line and per example. A line is written with a
single ``write`` under an exclusive lock and flushed to disk before the call returns, so a
crash can at worst leave one torn final line, which the next load drops with a warning
(the example is simply run again). A malformed line anywhere else is an error naming the
file and the line: nothing recorded is ever silently discarded.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class CorruptRecordsError(ValueError):
    """A records file holds a line that is not a valid record."""


class DuplicateRecordError(ValueError):
    """Two records claim the same identity."""


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise CorruptRecordsError(f"{path}:{number}: corrupt record ({error.msg}): {line[:120]!r}") from error
    if not isinstance(record, dict) or "example_id" not in record:
        raise CorruptRecordsError(f"{path}:{number}: not a record (no example_id): {line[:120]!r}")
    return record


def read_records(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """All records of ``path`` in file order.

    Raises ``CorruptRecordsError`` for a bad line (naming file and line) and
    ``DuplicateRecordError`` for two lines with one ``example_id``. A torn final line (no
    newline, not valid JSON) is dropped; with ``repair`` it is also cut from the file.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.decode("utf-8", errors="replace").split("\n")
    tail = lines.pop()
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse(path, number, line)
        first = seen.setdefault(record["example_id"], number)
        if first != number:
            raise DuplicateRecordError(
                f"{path}: lines {first} and {number} both record example_id={record['example_id']!r}"
            )
        records.append(record)
    if tail.strip():
        log.warning("%s: dropping a torn final line left by an interrupted write: %r", path, tail[:80])
        if repair:
            with path.open("r+b") as handle:
                handle.truncate(len(data) - len(tail.encode("utf-8")))
    return records


class RecordFile:
    """Appends records to one ``records.jsonl``, refusing an ``example_id`` already present."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._ids = {r["example_id"] for r in read_records(path, repair=True)}

    def __contains__(self, example_id: str) -> bool:
        return example_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def append(self, record: dict[str, Any]) -> None:
        example_id = record["example_id"]
        if example_id in self._ids:
            raise DuplicateRecordError(f"{self.path}: example_id={example_id!r} is already recorded")
        line = (json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n").encode("utf-8")
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            written = os.write(descriptor, line)
            if written != len(line):
                raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self._ids.add(example_id)

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path)
