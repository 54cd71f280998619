"""The files of a run folder: atomic appends, resumption, one writer at a time, no duplicates.

``records.jsonl`` holds one JSON object per line and per example. A line is written with a
single ``write`` under an exclusive lock and flushed to disk before the call returns, so a
kill can at worst leave one torn final line, which the next writer cuts (the example simply
runs again) and readers drop with a warning. A malformed line anywhere else is an error
naming the file and the line: nothing recorded is ever silently discarded.

One process writes a run folder at a time: ``RunLock`` holds ``<run>/.lock`` for the whole
run, and a second process is refused with the first one's pid, host and start time. Appends
re-read what other writers added under the file lock all the same, so an example recorded
by anyone is never recorded twice, even where the run lock does not hold (a filesystem
without ``flock``).

A companion file (``diagnostics.jsonl``) is written line for line just before its record;
``CompanionFile`` opens it by cutting a torn tail and dropping the lines of examples whose
record a kill prevented, so every line left belongs to exactly one record.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class CorruptRecordsError(ValueError):
    """A records file holds a line that is not a valid record."""


class DuplicateRecordError(ValueError):
    """Two records claim the same identity."""


class RunBusyError(ValueError):
    """Another process is writing the run folder."""


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    fix = f" — repair or delete line {number} (the example then runs again)"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise CorruptRecordsError(f"{path}:{number}: corrupt record ({error.msg}): {line[:80]!r}{fix}") from error
    if not isinstance(record, dict) or "example_id" not in record:
        raise CorruptRecordsError(f"{path}:{number}: not a record (no example_id): {line[:80]!r}{fix}")
    return record


def _split(data: bytes) -> tuple[list[str], str]:
    """Complete lines and the torn tail (text after the last newline)."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    return lines[:-1], lines[-1]


def read_records(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """All records of ``path`` in file order.

    Raises ``CorruptRecordsError`` for a bad line (naming file and line) and
    ``DuplicateRecordError`` for two lines with one ``example_id``. A torn final line (no
    newline) is dropped; with ``repair`` it is also cut from the file (only a writer holding
    the run lock may repair: a reader could otherwise cut a line being written).
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    lines, tail = _split(data)
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
                f" — delete one of them (keep the line whose run you trust)"
            )
        records.append(record)
    if tail.strip():
        log.warning("%s: dropping a torn final line left by an interrupted write: %r", path, tail[:80])
        if repair:
            with path.open("r+b") as handle:
                handle.truncate(len(data) - len(tail.encode("utf-8")))
    return records


def append_lines(path: Path, lines: list[bytes], ids_since: int | None = None) -> tuple[list[bool], int, set[str]]:
    """Append ``lines`` in one locked write and flush them to disk.

    With ``ids_since`` (a byte offset), the example ids written after that offset by other
    writers are read under the same lock first, and a line whose ``example_id`` is among them
    is not written. Returns (which lines were written, file size after, ids read).
    """
    descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        others: set[str] = set()
        written = [True] * len(lines)
        if ids_since is not None:
            size = os.fstat(descriptor).st_size
            if size > ids_since:
                complete, _ = _split(os.pread(descriptor, size - ids_since, ids_since))
                others = {_parse(path, 0, text)["example_id"] for text in complete if text.strip()}
            written = [json.loads(line)["example_id"] not in others for line in lines]
        data = b"".join(line for line, keep in zip(lines, written, strict=True) if keep)
        if data:
            count = os.write(descriptor, data)
            if count != len(data):
                raise OSError(f"{path}: short write ({count} of {len(data)} bytes)")
            os.fsync(descriptor)
        return written, os.fstat(descriptor).st_size, others
    finally:
        os.close(descriptor)


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


class RecordFile:
    """Appends records to one ``records.jsonl``, never an ``example_id`` already present.

    Open it while holding the run's ``RunLock``: opening cuts a torn final line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._ids = {r["example_id"] for r in read_records(path, repair=True)}
        self._size = path.stat().st_size if path.exists() else 0
        # Examples another writer recorded after this file was opened.
        self._others: set[str] = set()

    def __contains__(self, example_id: str) -> bool:
        return example_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def append(self, record: dict[str, Any]) -> bool:
        """Append ``record``; False (nothing written) when another writer recorded its example meanwhile."""
        return self.append_many([record])[0]

    def append_many(self, records: list[dict[str, Any]]) -> list[bool]:
        """Append ``records`` in one write (one flush to disk); per record, whether it was written.

        A record whose example another writer recorded meanwhile is left out (False).
        """
        fresh = []
        for record in records:
            example_id = record["example_id"]
            if example_id in self._ids and example_id not in self._others:
                raise DuplicateRecordError(f"{self.path}: example_id={example_id!r} is already recorded")
            fresh.append(example_id not in self._others)
        written, self._size, others = append_lines(
            self.path, [_encode(r) for r, new in zip(records, fresh, strict=True) if new], ids_since=self._size
        )
        self._ids |= others
        self._others |= others
        results = iter(written)
        outcome = [new and next(results) for new in fresh]
        for record, kept in zip(records, outcome, strict=True):
            if kept:
                self._ids.add(record["example_id"])
            else:
                log.warning(
                    "%s: %s was recorded by another process meanwhile; keeping that record",
                    self.path,
                    record["example_id"],
                )
        return outcome

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path)


class CompanionFile:
    """A per-example file written just before each record (``diagnostics.jsonl``).

    Opening it keeps only the complete lines of examples that have a record: a kill between
    the companion line and its record leaves a line that the rerun would write again.
    """

    def __init__(self, path: Path, recorded: RecordFile) -> None:
        self.path = path
        if not path.exists():
            return
        lines, tail = _split(path.read_bytes())
        complete = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
        kept = [line for number, line in complete if _parse(path, number, line)["example_id"] in recorded]
        dropped = len(complete) - len(kept) + bool(tail.strip())
        if dropped:
            log.warning("%s: dropping %d line(s) left by an interrupted run (no record)", path, dropped)
            write_atomic(path, "".join(line + "\n" for line in kept))

    def append(self, line: dict[str, Any]) -> None:
        append_lines(self.path, [_encode(line)])


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename: a kill leaves the old file or the new one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class RunLock:
    """``<folder>/.lock``, held for a whole run: one process writes a run folder at a time.

    The lock is the kernel's (``flock``), so it ends with its process however that ends; the
    file's content (pid, host, start time, command) only names the holder for the message.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / ".lock"
        self._descriptor: int | None = None

    def __enter__(self) -> RunLock:
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunBusyError(f"{self.path.parent} is being written by {self.holder()} — {_BUSY_FIX}") from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": sys.argv,
        }
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(holder).encode(), 0)
        self._descriptor = descriptor
        return self

    def holder(self) -> str:
        """Who holds the lock, from the lock file."""
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            holder = {}
        if "pid" not in holder:
            return "another process"
        return f"pid {holder['pid']} on {holder.get('host', '?')} (started {holder.get('started_at', '?')})"

    def __exit__(self, *exc: object) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


_BUSY_FIX = "wait for it to finish (a rerun then resumes), or stop it; the same config twice runs once"
