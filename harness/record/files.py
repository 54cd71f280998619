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

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.record.schema import SCHEMA_VERSION

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
    version = record.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise CorruptRecordsError(
            f"{path}:{number}: a record of schema version {version!r}, newer than the {SCHEMA_VERSION} this evictbench"
            " reads — upgrade evictbench (git pull, then make install) to read it"
        )
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


def read_first_record(path: Path) -> dict[str, Any] | None:
    """The first record of ``path`` (None when it holds no complete line), without reading the rest."""
    if not path.exists():
        return None
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                return None
            if line.strip():
                return _parse(path, number, line.decode("utf-8", errors="replace"))
    return None


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


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (an undefined measure, NaN) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def encode(record: dict[str, Any]) -> bytes:
    # Strict JSON: strict parsers refuse NaN and Infinity, so an undefined measure is written as null.
    return (json.dumps(_finite(record), ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


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
            self.path, [encode(r) for r, new in zip(records, fresh, strict=True) if new], ids_since=self._size
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
        append_lines(self.path, [encode(line)])


def writable_folder(folder: Path, option: str) -> Path:
    """Create ``folder`` if needed and check that files can be written there; ``option`` names its setting."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write to {folder} ({error.strerror or error}) — set {option} to a folder you can write"
        ) from error
    return folder


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

    Entering makes the folder if needed and locks it in one step. The lock is the kernel's
    (``flock``), so it ends with its process however that ends; the file's content (pid, host,
    start time, command) only names the holder for the message. A holder may remove the folder
    (``discard_unrecorded``) while it holds the lock: it unlinks the lock file first, so a
    process that was waiting on that file sees, once it gets the lock, that the file it locked
    is no longer the folder's, and starts over with a fresh folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / ".lock"
        self._descriptor: int | None = None

    def _open_current(self) -> int:
        """A locked descriptor of the folder's current lock file (raises ``RunBusyError`` when held)."""
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue  # the folder went between mkdir and open
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                os.close(descriptor)
                if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise RunBusyError(f"{self.folder} is being written by {self.holder()} — {_BUSY_FIX}") from None
            try:
                current = os.stat(self.path).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                current = False
            if current:
                return descriptor
            os.close(descriptor)

    def __enter__(self) -> RunLock:
        descriptor = self._open_current()
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

    def discard_unrecorded(self) -> None:
        """Remove the folder if it holds no records (a run that failed before its first), while locked."""
        if self._descriptor is None or (self.folder / "records.jsonl").exists():
            return
        self.path.unlink(missing_ok=True)
        for path in self.folder.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # something else put a file there meanwhile: leave it
            self.folder.rmdir()

    def __exit__(self, *exc: object) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


_BUSY_FIX = "wait for it to finish (a rerun then resumes), or stop it; the same config twice runs once"
