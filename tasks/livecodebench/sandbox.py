"""The sandbox model-written code runs in: one bubblewrap container per test, seen from outside.

An audit hook inside the interpreter that runs the code cannot be a boundary (the code can disarm
it, and many system calls raise no audit event), so containment comes from the operating system,
and every layer is one the code cannot reach:

1. bubblewrap (``bwrap``, Debian's ``bubblewrap``) starts each test in fresh user, mount, PID,
   network, IPC, UTS and cgroup namespaces, as ``nobody`` of its user namespace with no capability
   (on the host it keeps the harness's uid, and can use only what is shown to it), no further user
   namespaces, its own session, an empty environment, and death with the harness. Its file system is
   an empty read-only root holding only the interpreter's prefix, ``/usr`` and the library folders
   (read-only), four harmless devices and ``runner.py``; the only writable place is ``/sandbox``, a
   tmpfs of ``file_mb``, gone when the test ends. ``/etc``, ``/proc``, ``/tmp``, home folders, the
   project and the task's data are not there to be read or written. No network exists.
2. ``runner.py`` (trusted; the code runs after it) lowers its resource limits and installs a
   seccomp filter, built here with libseccomp, before the solution is compiled: no new process or
   program (``fork``, ``vfork``, ``clone`` but for threads, ``execve``), no socket, no device node
   or FIFO, no ptrace, mounts, namespaces, io_uring, BPF, keys or modules. It refuses to run the
   code when the filter is not in force.
3. The result channel is framed here: each test is its own container that is given only that
   test's input, and its run counts only when it ends cleanly having written exactly one result
   line. Whatever the code writes on any descriptor it holds can at most answer the one test whose
   input it was given; it cannot speak for other tests, nor see their outputs, which never enter
   the sandbox.
4. The runner's audit hook still refuses sockets, processes, ctypes and writes outside
   ``/sandbox`` early, with a clear message; it is a courtesy, not a layer.
5. A wall-clock limit per test, after which the container is killed.

LiveCodeBench runs in-process guards in a ``multiprocessing`` child (as human-eval and the
bigcode harness do), which a solution can undo; here nothing the code can reach decides its verdict.
Where a layer cannot be had (no ``bwrap``, no user namespaces, no seccomp), ``check_available``
raises ``ValueError`` with the fix, and nothing is graded.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

BWRAP = "bwrap"
LIBSECCOMP = "libseccomp.so.2"
RUNNER = Path(__file__).with_name("runner.py")
PROJECT = Path(__file__).resolve().parents[2]
WORK = "/sandbox"
NOBODY = 65534
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
LIBRARY_FOLDERS = ("/lib", "/lib32", "/lib64", "/libx32")

# Refused with EPERM once the runner has started. Threads stay allowed (``clone`` with CLONE_THREAD):
# competitive programs start one for a deeper stack.
DENIED_SYSCALLS = (
    # new processes and programs
    "fork", "vfork", "execve", "execveat",
    # other processes' memory and descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # mounts, namespaces, roots
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick",
    # device nodes, FIFOs, and opening files by handle rather than by path
    "mknod", "mknodat", "name_to_handle_at", "open_by_handle_at",
    # any network, even local
    "socket", "socketpair",
    # kernel interfaces a computation never needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "syslog", "acct", "swapon", "swapoff", "quotactl", "quotactl_fd", "lookup_dcookie",
    "fanotify_init", "personality", "uselib", "ioperm", "iopl", "modify_ldt", "vhangup", "sethostname",
    "setdomainname", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)  # fmt: skip
CLONE_THREAD = 0x00010000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


@dataclass(frozen=True)
class Limits:
    """What one sandboxed test may use.

    Parameters:
        test_timeout_s: wall seconds for defining the solution, and again for the test (LiveCodeBench: 6).
        memory_mb: address-space limit.
        file_mb: what the code may write in its folder (the folder's size, so also its largest file).
        processes: limit on threads for an unprivileged user (new processes are refused outright).
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

    def cpu_s(self) -> int:
        """CPU seconds of one test's process: the definition and the test, and a second to start."""
        return 2 * self.test_timeout_s + 1

    def wall_s(self) -> float:
        """Wall-clock limit of one test's container: the definition and the test, and 5 s to start and stop."""
        return 2 * self.test_timeout_s + 5


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _libseccomp() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    except OSError as error:
        raise ValueError(
            f"libseccomp is not installed ({error}), and the sandbox's system-call filter needs it"
            " — install it: apt-get install libseccomp2"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)
    ]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def _errno_action(code: int) -> int:
    return 0x00050000 | code  # SCMP_ACT_ERRNO


@cache
def seccomp_program() -> bytes:
    """The runner's system-call filter as classic BPF for this machine's architecture (libseccomp).

    Everything not listed is allowed; a listed call fails with EPERM; ``clone3`` fails with ENOSYS
    (its flags cannot be inspected), so the C library falls back to ``clone``, whose flags can: a
    thread passes, a process does not. Calls of another architecture (x32, i386) kill the process.
    """
    lib = _libseccomp()
    context = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not context:
        raise ValueError(
            "libseccomp could not start a filter — install a working libseccomp: apt-get install libseccomp2"
        )
    try:

        def deny(name: str, action: int, *conditions: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # unknown, or not a call of this architecture (libseccomp's pseudo-numbers)
                return
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            status = lib.seccomp_rule_add_array(context, action, number, len(conditions), array)
            if status != 0:
                raise ValueError(f"libseccomp refused a rule for {name} ({os.strerror(-status)}) — update libseccomp2")

        for name in DENIED_SYSCALLS:
            deny(name, _errno_action(errno.EPERM))
        deny("clone3", _errno_action(errno.ENOSYS))
        deny("clone", _errno_action(errno.EPERM), _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
        with tempfile.TemporaryFile() as out:
            status = lib.seccomp_export_bpf(context, out.fileno())
            if status != 0:
                raise ValueError(
                    f"libseccomp could not export the filter ({os.strerror(-status)}) — update libseccomp2"
                )
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(context)


def _interpreter() -> tuple[str, str]:
    """The real interpreter binary and the prefix it finds its standard library in."""
    prefix = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if not _under(executable, prefix):
        raise ValueError(
            f"the interpreter {executable} lies outside its prefix {prefix}, and the sandbox shows only the prefix"
            " — run with a Python whose binary is inside its installation (pyenv's, Debian's, a venv of either)"
        )
    return executable, prefix


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _shown() -> list[str]:
    """The host folders the sandbox shows, read-only: ``/usr``, the library folders, the interpreter's prefix."""
    shown = ["/usr", *(os.path.realpath(f) for f in LIBRARY_FOLDERS if os.path.isdir(f) and not os.path.islink(f))]
    prefix = _interpreter()[1]
    return shown if any(_under(prefix, folder) for folder in shown) else [*shown, prefix]


def _command(limits: Limits) -> list[str]:
    mounts = []
    for folder in _shown():
        mounts += ["--ro-bind", folder, folder]
    for link in LIBRARY_FOLDERS:
        if os.path.islink(link):  # merged /usr: /lib -> usr/lib
            mounts += ["--symlink", os.readlink(link), link]
    for device in DEVICES:
        mounts += ["--dev-bind", device, device]
    environment = {"HOME": WORK, "TMPDIR": WORK, "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}
    return [
        shutil.which(BWRAP) or BWRAP,
        "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--hostname", "sandbox", "--clearenv",
        *mounts,
        "--ro-bind", str(RUNNER), "/runner.py",
        "--size", str(limits.file_mb << 20), "--perms", "0700", "--tmpfs", WORK,
        "--remount-ro", "/",
        "--chdir", WORK,
        *(arg for name, value in environment.items() for arg in ("--setenv", name, value)),
        "--", _interpreter()[0], "-I", "-B", "/runner.py",
    ]  # fmt: skip


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _read(process: subprocess.Popen, deadline: float, cap: int) -> bytes | dict[str, Any]:
    """The process's stdout until it closes, or the outcome of a run past its deadline or its output cap."""
    chunks, size = [], 0
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return {"timeout": True}
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                return {"error": f"the result is larger than {cap >> 20} MB"}


def _first_line(stream: Any) -> str:
    stream.seek(0)
    lines = stream.read(4096).decode(errors="replace").strip().splitlines()
    return lines[0] if lines else ""


def _framed(raw: bytes, mode: str) -> dict[str, Any] | None:
    """The one result line a run wrote, or None when it wrote anything else."""
    if not raw.endswith(b"\n") or raw.count(b"\n") != 1:
        return None
    try:
        outcome = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(outcome, dict) or len(outcome) != 1:
        return None
    if "output" in outcome:
        return outcome if mode == "functional" or isinstance(outcome["output"], str) else None
    if "error" in outcome:
        return outcome if isinstance(outcome["error"], str) else None
    return outcome if outcome.get("timeout") is True else None


def _contain(job: dict[str, Any], limits: Limits) -> tuple[dict[str, Any], str]:
    """Run one test's job in a fresh container: its outcome, and the first line bwrap complained with."""
    payload = {
        **job,
        "limits": {**asdict(limits), "cpu_s": limits.cpu_s()},
        "seccomp": base64.b64encode(seccomp_program()).decode(),
    }
    # The job comes in as a file, so that nothing can block on writing it; nobody inside can reopen it.
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(payload).encode())
        stdin.seek(0)
        process = subprocess.Popen(
            _command(limits), stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, env={}, start_new_session=True
        )
        try:
            raw = _read(process, time.monotonic() + limits.wall_s(), limits.memory_mb << 20)
            if isinstance(raw, bytes):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=1)
        finally:
            _kill(process)
        if isinstance(raw, dict):
            return raw, ""
        complaint = _first_line(stderr)
    if process.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):  # past its CPU seconds
        return {"timeout": True}, complaint
    if process.returncode != 0:  # a result counts only from a run that ended cleanly
        return {"error": f"the sandboxed test ended without a result (exit status {process.returncode})"}, complaint
    outcome = _framed(raw, job["mode"])
    return (outcome, "") if outcome is not None else ({"error": "the solution wrote on the result channel"}, complaint)


PROBE = {"code": "print(input())", "mode": "stdin", "fn_name": None, "input": "contained\n", "timeout": 5}


@cache
def _unavailable() -> str | None:
    """Why this machine cannot contain code (the reason and the fix), or None; probed once per process."""
    if not sys.platform.startswith("linux"):
        return "the LiveCodeBench sandbox needs Linux (namespaces, seccomp) — run the task on Linux"
    if shutil.which(BWRAP) is None:
        return "bubblewrap (bwrap) is not installed, and the sandbox needs it — install it: apt-get install bubblewrap"
    try:
        seccomp_program()
        _interpreter()
    except ValueError as error:
        return str(error)
    try:
        outcome, complaint = _contain(PROBE, Limits(test_timeout_s=5, memory_mb=1024))
    except OSError as error:
        return f"bubblewrap could not be started ({error}) — install it: apt-get install bubblewrap"
    if outcome == {"output": "contained\n"}:
        return None
    why = complaint or outcome.get("error") or "it timed out"
    if "seccomp" in why:
        return f"the kernel refused the sandbox's seccomp filter ({why}) — use a Linux kernel with seccomp filters"
    return (
        f"bubblewrap could not start the sandbox ({why}) — allow unprivileged user namespaces"
        " (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces>0) or run as root"
    )


def check_available(*hidden: str | Path) -> None:
    """Raise ``ValueError`` (what is missing — how to get it) unless code can be contained here.

    ``hidden``: files the code must not read (the task's data); they, and the project, must lie
    outside what the sandbox shows.
    """
    reason = _unavailable()
    if reason is not None:
        raise ValueError(reason)
    shown = _shown()
    for path in (PROJECT, *hidden):
        real = os.path.realpath(path)
        folder = next((folder for folder in shown if _under(real, folder)), None)
        if folder is not None:
            raise ValueError(
                f"{path} lies under {folder}, which the sandbox shows to the code — move it out of {folder}"
            )


def run(job: dict[str, Any], limits: Limits) -> Iterator[dict[str, Any]]:
    """Run each of ``job["inputs"]`` in its own container and yield each test's outcome, in order.

    An outcome is ``{"output": ...}``, ``{"error": ...}`` or ``{"timeout": True}``. The caller stops
    iterating at the first failure; later tests then never run.
    """
    check_available()
    test = {key: value for key, value in job.items() if key != "inputs"}
    for text in job["inputs"]:
        yield _contain({**test, "input": text}, limits)[0]
