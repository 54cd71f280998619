"""The sandbox model-written code runs in: a subprocess without network, with time and memory limits, in a
temporary folder.

Layers, each holding what the one before lets through:

1. ``runner.py``'s audit hook refuses sockets, new processes, ctypes and writes outside the folder;
2. a fresh temporary folder is the working directory, ``HOME`` and ``TMPDIR``, removed afterwards;
   the environment is empty but for ``PATH``; Python runs isolated (``-I``) without bytecode writes;
3. resource limits: CPU seconds, address space, file size, open files, no core dumps, and (for an
   unprivileged user) processes;
4. Linux namespaces when ``unshare`` works here: a new network namespace (only a downed loopback:
   no network at all) and PID namespace (every process the code starts dies with it); run by
   root, the code also drops to ``nobody`` (``setpriv``), so the file system's permissions apply;
5. a wall-clock timeout, after which the whole process group is killed.

``run`` yields the runner's result lines as they arrive, so the caller can stop at the first
failing test (the process is killed then, as on timeout).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).with_name("runner.py")
NOBODY = 65534


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use.

    Parameters:
        test_timeout_s: wall seconds per test inside the runner (LiveCodeBench: 6).
        memory_mb: address-space limit.
        file_mb: largest file the code may write (inside its folder).
        processes: process limit for an unprivileged user (the PID namespace holds root's).
    """

    test_timeout_s: int = 6
    memory_mb: int = 4096
    file_mb: int = 16
    processes: int = 256

    def __post_init__(self) -> None:
        for name in ("test_timeout_s", "memory_mb", "file_mb", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"task.sandbox.{name}={value!r} must be an integer >= 1 — use e.g. 6")

    def wall_s(self, tests: int) -> float:
        """The whole run's wall-clock limit: LiveCodeBench's ``(timeout + 1) * tests + 5``."""
        return (self.test_timeout_s + 1) * max(tests, 1) + 5


@cache
def namespace_prefix() -> tuple[str, ...]:
    """The command prefix that gives the code its own network and PID namespaces (and drops root), or ()."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    root = os.geteuid() == 0
    prefix = [unshare, "--net", "--pid", "--fork", "--kill-child"] + ([] if root else ["--user", "--map-root-user"])
    setpriv = shutil.which("setpriv")
    if root and setpriv is not None:
        prefix += [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(prefix) if probe.returncode == 0 else ()


def _limit(limits: Limits, cpu_s: int):
    def apply() -> None:
        os.setsid()
        memory = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Root is not held to RLIMIT_NPROC; the PID namespace and the drop to nobody are.
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return apply


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run(job: dict[str, Any], limits: Limits) -> Iterator[dict[str, Any]]:
    """Run the runner on ``job`` (without ``root``, which is set here) and yield each result line.

    A line that is not a JSON object (the code wrote on the runner's channel) ends the run as an
    error; a run past its wall-clock limit yields ``{"timeout": True}``. Stopping the iteration
    kills the process.
    """
    tests = len(job["inputs"])
    with tempfile.TemporaryDirectory(prefix="evb-sandbox-") as folder:
        os.chmod(folder, 0o777)  # writable by nobody, whom root drops to
        runner = Path(folder) / "runner.py"
        shutil.copyfile(RUNNER, runner)
        os.chmod(runner, 0o444)
        payload = json.dumps({**job, "root": folder}).encode()
        command = [*namespace_prefix(), sys.executable, "-I", "-B", str(runner)]
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        cpu_s = (limits.test_timeout_s + 1) * max(tests, 1)
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            env=env,
            preexec_fn=_limit(limits, cpu_s),
        )
        deadline = time.monotonic() + limits.wall_s(tests)
        try:
            process.stdin.write(payload)
            process.stdin.close()
        except BrokenPipeError:
            pass
        # The pipe is read with a deadline: a result line, or the limit.
        os.set_blocking(process.stdout.fileno(), False)
        buffer = b""
        try:
            while True:
                newline = buffer.find(b"\n")
                if newline >= 0:
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    try:
                        outcome = json.loads(line)
                    except ValueError:
                        outcome = None
                    if not isinstance(outcome, dict):
                        yield {"error": "the solution wrote on the result channel"}
                        return
                    yield outcome
                    continue
                if time.monotonic() > deadline:
                    yield {"timeout": True}
                    return
                try:
                    chunk = process.stdout.read()
                except BlockingIOError:
                    chunk = None
                if chunk:
                    buffer += chunk
                    continue
                if chunk == b"" and process.poll() is not None:
                    if buffer.strip():
                        buffer += b"\n"
                        continue
                    return
                time.sleep(0.005)
        finally:
            _kill(process)
