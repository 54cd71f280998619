"""The LiveCodeBench sandbox against attacks: each class that got out of the in-process guard, and variants.

Every attack is a solution, graded by ``grade`` as a model's would be (or run by ``sandbox.run`` to
see what it saw). Most first disarm the runner's audit hook, as any solution can (the hook is plain
Python in the solution's own interpreter), so what stops them is the operating system: bubblewrap's
namespaces and empty root, the seccomp filter, the limits, and the harness's framing of results.
An attack is contained when its verdict is not a pass and it left nothing behind; where a
legitimate solution could be caught by the same wall, a control shows it still passes.

The module needs bubblewrap (``make test-system`` installs it): without it the module fails as
root, as in CI, and is skipped with the reason for anyone else.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import refused
from test_livecodebench import FIXTURE, Tokenizer, require_sandbox

from tasks.livecodebench import sandbox
from tasks.livecodebench.grading import Verdict, grade
from tasks.livecodebench.sandbox import Limits
from tasks.livecodebench.task import LiveCodeBenchTask

require_sandbox()

QUICK = Limits(test_timeout_s=1, memory_mb=1024)
ONE = [{"input": "1\n", "output": "1\n", "testtype": "stdin"}]
TWO = [*ONE, {"input": "2\n", "output": "2\n", "testtype": "stdin"}]
# What any solution can do to the runner's audit hook: empty its lists and make every path look inside.
DISARM = (
    "import os, sys\n_runner = sys.modules['__main__']\n_runner.FORBIDDEN = set()\n"
    "_runner.FORBIDDEN_PREFIXES = ('\\0',)\n_runner.WRITE_FLAGS = 0\n_cwd = os.getcwd()\n"
    "os.path.realpath = lambda path, *a, **k: _cwd\n"
)
# Both tests' expected results, as the runner would write them.
FORGED = b'{"output": "1\\n"}\n{"output": "2\\n"}\n'
PR_SET_CHILD_SUBREAPER = 36
# Writes both forged results on every descriptor the process may hold.
EVERY_FD = (
    f"import os\nfor fd in range(256):\n    try:\n        os.write(fd, {FORGED!r})\n    except OSError:\n        pass\n"
)
CLONE = sandbox._libseccomp().seccomp_syscall_resolve_name(b"clone")  # this architecture's number


def graded(code: str, tests: list[dict[str, str]] = ONE) -> Verdict:
    return grade(code, tests, None, QUICK)


def seen(code: str) -> dict:
    """The outcome of ``code`` run in the sandbox on one empty input: what it could see."""
    job = {"code": code, "mode": "stdin", "fn_name": None, "inputs": [""], "timeout": 2}
    results = sandbox.run(job, QUICK)
    try:
        return next(results)
    finally:
        results.close()


def runners_left() -> list[str]:
    """Sandboxed processes of this test run still alive: orphans come to us, a subreaper (see ``reaper``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
            if f"\nPPid:\t{os.getpid()}\n" in status and b"runner.py" in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:  # gone meanwhile
            pass
    return found


@pytest.fixture(scope="module", autouse=True)
def reaper() -> Iterator[None]:
    """Make this process the subreaper of what it starts, so that no sandboxed process can leave unseen."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A path on the host the code must not create."""
    target = Path("/tmp") / f"evb-escape-{uuid.uuid4().hex}"
    yield target
    if target.exists() or target.is_symlink():
        target.unlink()


# --- 15: writes outside the folder -------------------------------------------------------------------------

WRITES = {
    "os.open with dir_fd on /tmp": "os.close(os.open({name!r}, os.O_CREAT, dir_fd=os.open('/tmp', 0)))",
    "os.open with dir_fd on /": "os.close(os.open('tmp/' + {name!r}, os.O_CREAT, dir_fd=os.open('/', 0)))",
    "os.mkfifo": "os.mkfifo({target!r})",
    "os.mkfifo with dir_fd": "os.mkfifo({name!r}, dir_fd=os.open('/tmp', 0))",
    "os.mknod": "os.mknod({target!r}, 0o600 | stat.S_IFREG)",
    "os.rename with dst_dir_fd": "open('f', 'w').close()\nos.rename('f', {name!r}, dst_dir_fd=os.open('/tmp', 0))",
    "os.link with dst_dir_fd": "open('f', 'w').close()\nos.link('f', {name!r}, dst_dir_fd=os.open('/tmp', 0))",
    "a symlink, then open": DISARM + "os.symlink({target!r}, 'link')\nopen('link', 'w').write('x')",
    "open with the hook disarmed": DISARM + "open({target!r}, 'w').write('x')",
    "/proc/self/root": DISARM + "open('/proc/self/root' + {target!r}, 'w').write('x')",
    "/proc/1/cwd": DISARM + "open('/proc/1/cwd/../../..' + {target!r}, 'w').write('x')",
}


@pytest.mark.parametrize("attack", WRITES.values(), ids=WRITES.keys())
def test_writes_outside_the_folder_are_contained(attack: str, outside: Path) -> None:
    code = "import os, stat\n" + attack.format(name=outside.name, target=str(outside)) + "\nprint(1)"
    verdict = graded(code)
    assert not verdict.passed and not outside.exists() and not outside.is_symlink(), verdict


def test_writes_into_the_project_through_dir_fd_are_contained() -> None:
    name = f"evb-escape-{uuid.uuid4().hex}"
    project = Path(__file__).parent
    code = f"import os\nos.close(os.open({name!r}, os.O_CREAT, dir_fd=os.open({str(project)!r}, 0)))"
    assert not graded(code + "\nprint(1)").passed
    assert not (project / name).exists()


def test_what_the_sandbox_shows_is_read_only() -> None:
    name = f"evb-escape-{uuid.uuid4().hex}"
    prefix = os.path.realpath(sandbox.sys.base_prefix)
    for folder in (prefix, "/usr/lib", "/dev"):
        verdict = graded(DISARM + f"os.close(os.open({name!r}, os.O_CREAT, dir_fd=os.open({folder!r}, 0)))\nprint(1)")
        assert not verdict.passed and "Read-only file system" in verdict.reason, verdict
        assert not (Path(folder) / name).exists()


def test_no_fifo_or_device_node_even_in_its_own_folder() -> None:
    for code in (
        "os.mkfifo('pipe')",
        "os.mknod('node', 0o600 | stat.S_IFREG)",
        "os.mknod('null', 0o600 | stat.S_IFCHR, os.makedev(1, 3))",
    ):
        verdict = graded(f"import os, stat\n{code}\nprint(1)")
        assert not verdict.passed and "PermissionError" in verdict.reason, verdict


def test_its_own_folder_stays_writable_and_is_gone_afterwards() -> None:
    code = "import os, tempfile\nopen('a', 'w').write('x')\nwith tempfile.TemporaryFile() as f:\n    f.write(b'y')\n"
    assert graded(code + "print(len(os.listdir('.')))").passed  # only 'a': the folder starts empty
    assert graded("import os\nprint(len(os.listdir('.')) + 1)").passed


# --- 16: new processes -------------------------------------------------------------------------------------

CHILD_EXITS = "if pid == 0:\n    os._exit(0)\nassert pid > 0"
FORK_EXEC = (
    "import _posixsubprocess\nr, w = os.pipe()\n"
    "pid = _posixsubprocess.fork_exec([b'/usr/bin/true'], [b'/usr/bin/true'], True, (w,), None, None,"
    " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\nos.waitpid(pid, 0)"
)
PROCESSES = {
    "_posixsubprocess.fork_exec": FORK_EXEC,
    "os.fork": DISARM + "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)",
    "os.posix_spawn": DISARM + "os.waitpid(os.posix_spawn('/usr/bin/true', ['true'], {}), 0)",
    "subprocess.run": DISARM + "import subprocess\nsubprocess.run(['/usr/bin/true'], check=True)",
    "os.system": DISARM + "assert os.system('true') == 0",
    "multiprocessing": DISARM
    + "import multiprocessing\np = multiprocessing.get_context('fork').Process(target=int)\np.start()\np.join()",
    # ctypes is imported in the body: an import at the top would run before the hook is disarmed
    "fork through ctypes": DISARM + "libc = __import__('ctypes').CDLL(None)\npid = libc.fork()\n" + CHILD_EXITS,
    "the clone system call through ctypes": DISARM
    + f"libc = __import__('ctypes').CDLL(None)\npid = libc.syscall({CLONE}, 17, 0, 0, 0, 0)\n"
    + CHILD_EXITS,
    # a fresh interpreter has no audit hook, and here it forges both results
    "exec a fresh interpreter": DISARM
    + "exe = next(p for p in ('/usr/bin/python3', sys.executable) if os.access(p, os.X_OK))\n"
    + f"os.execv(exe, [exe, '-c', {EVERY_FD!r}])",
}


@pytest.mark.parametrize("attack", PROCESSES.values(), ids=PROCESSES.keys())
def test_new_processes_are_refused(attack: str) -> None:
    verdict = graded("import os, sys\n" + attack + "\nprint(input())", TWO)
    assert not verdict.passed and verdict.tests_passed == 0, verdict
    assert not runners_left()


@pytest.mark.parametrize(
    "bomb",
    [DISARM + "while True:\n    os.fork()", FORK_EXEC.replace("pid =", "while True:\n    pid =")],
    ids=["os.fork", "_posixsubprocess.fork_exec"],
)
def test_fork_bombs_end_at_once_and_leave_nothing(bomb: str) -> None:
    start = time.monotonic()
    verdict = graded("import os\n" + bomb)
    assert not verdict.passed and "PermissionError" in verdict.reason, verdict
    assert time.monotonic() - start < QUICK.test_timeout_s + 2 and not runners_left()


def test_threads_still_run_for_deep_recursion() -> None:
    code = (
        "import sys, threading\nsys.setrecursionlimit(10 ** 6)\nthreading.stack_size(1 << 26)\n"
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "def main():\n    print(depth(int(input()) * 20000) // 20000)\n"
        "t = threading.Thread(target=main)\nt.start()\nt.join()"
    )
    assert graded(code, TWO).passed


# --- 17: reads ---------------------------------------------------------------------------------------------


def test_the_host_files_are_not_there_to_read(tmp_path: Path) -> None:
    data = tmp_path / "test6.jsonl"
    secret = uuid.uuid4().hex
    data.write_text(json.dumps({"private_test_cases": secret}) + "\n")
    readme = Path(__file__).parents[1] / "README.md"
    for path, expected in (
        ("/etc/passwd", Path("/etc/passwd").read_text().splitlines()[0]),
        (str(readme), readme.read_text().splitlines()[0]),
        (str(data), json.dumps({"private_test_cases": secret})),
        (str(FIXTURE), FIXTURE.read_text().splitlines()[0]),
    ):
        for how in (f"open({path!r})", f"os.fdopen(os.open({path!r}.lstrip('/'), 0, dir_fd=os.open('/', 0)))"):
            verdict = graded(f"import os\nprint({how}.readline().rstrip())", [{"input": "", "output": expected}])
            assert not verdict.passed and "FileNotFoundError" in verdict.reason, (path, verdict)
            assert secret not in verdict.reason


def test_the_sandbox_shows_only_the_interpreter_and_its_own_folder() -> None:
    code = (
        "import os, sys\nsystem = ('/usr', '/lib', '/lib32', '/lib64', '/libx32', os.path.realpath(sys.base_prefix))\n"
        "found = []\nfor top, folders, files in os.walk('/'):\n"
        "    folders[:] = [f for f in folders if os.path.join(top, f) not in system]\n"
        "    found += [os.path.join(top, name) for name in files + folders]\nprint(sorted(found))"
    )
    outcome = seen(code)
    prefix = os.path.realpath(sandbox.sys.base_prefix)
    ancestors = {str(parent) for parent in Path(prefix).parents if str(parent) != "/"}
    devices = {"/dev", *sandbox.DEVICES}
    allowed = {"/runner.py", "/sandbox", "/usr", "/lib", "/lib32", "/lib64", "/libx32", prefix, *ancestors, *devices}
    found = set(ast.literal_eval(outcome["output"]))
    assert found <= allowed, found - allowed


def test_no_proc_and_no_harness_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = uuid.uuid4().hex
    monkeypatch.setenv("EVB_SECRET", secret)
    code = (
        "import os\nseen = [repr(dict(os.environ))]\n"
        "for path in ('/proc/1/environ', '/proc/self/environ', '/proc/1/cmdline', '/proc/self/status'):\n"
        "    try:\n        seen.append(open(path).read())\n"
        "    except OSError as e:\n        seen.append(type(e).__name__)\n"
        "print(seen)"
    )
    output = seen(code)["output"]
    assert secret not in output and output.count("FileNotFoundError") == 4, output
    assert "EVB_SECRET" not in output and "HOME': '/sandbox'" in output


def test_other_tests_and_every_expected_output_stay_outside() -> None:
    """While test 1 runs, nothing of test 2 (its input) nor any expected output is in the process's memory."""
    marker = "EVB" + "MARK"
    tests = [
        {"input": "1\n", "output": f"{marker}:out-1\n"},
        {"input": f"{marker}:in-2\n", "output": f"{marker}:out-2\n"},
    ]
    code = (
        "import gc\nmark = 'EVB' + 'MARK'\nfound = set()\nfor o in gc.get_objects():\n"
        "    for s in [o] if isinstance(o, str) else o if isinstance(o, (list, dict, tuple)) else []:\n"
        "        if isinstance(s, str) and s.startswith(mark) and len(s) > len(mark):\n            found.add(s)\n"
        "print(sorted(found))"
    )
    assert seen(code) == {"output": "[]\n"}
    assert not grade(code, tests, None, QUICK).passed


# --- 18: the result channel ---------------------------------------------------------------------------------

CHANNEL = {
    "forged lines on every descriptor": EVERY_FD + "print(0)",
    "forged lines on every descriptor, then a clean exit": EVERY_FD + "os._exit(0)",
    "forged lines with claims beyond an output": EVERY_FD.replace(
        repr(FORGED), repr(b'{"output": "1\\n", "passed": true, "tests_passed": 2}\n')
    )
    + "os._exit(0)",
    "/proc/self/fd": DISARM
    + "for fd in range(256):\n    try:\n"
    + f"        open(f'/proc/self/fd/{{fd}}', 'wb').write({FORGED!r})\n    except OSError:\n        pass\nprint(0)",
    "the runner's json.dumps": f"import json\njson.dumps = lambda *a, **k: {FORGED.decode().rstrip()!r}\nprint(0)",
    "every file object found through gc": "import gc, io\nfor f in gc.get_objects():\n"
    + f"    if isinstance(f, io.TextIOWrapper):\n        try:\n            f.write({FORGED.decode()!r})\n"
    + "            f.flush()\n        except Exception:\n            pass\nprint(0)",
    "kill pid 1": DISARM + "os.kill(1, 9)",
    "kill the parent": DISARM + "os.kill(os.getppid(), 9)",
    "kill every process it may": DISARM + "os.kill(-1, 9)",
}


@pytest.mark.parametrize("attack", CHANNEL.values(), ids=CHANNEL.keys())
def test_the_result_channel_cannot_be_forged(attack: str) -> None:
    verdict = graded("import os, sys\n" + attack, TWO)
    assert not verdict.passed and verdict.tests_passed == 0, verdict
    assert not runners_left()


def test_each_test_runs_afresh_so_answers_cannot_follow_the_order() -> None:
    """A solution that counts its calls (to print the n-th stored answer) sees every test as the first."""
    code = "import sys\nsys.calls = getattr(sys, 'calls', 0) + 1\nprint(sys.calls)"
    assert grade(code, ONE, None, QUICK).passed and not grade(code, TWO, None, QUICK).passed


# --- the kernel's other doors, and what solutions legitimately do ------------------------------------------


def test_every_denied_system_call_is_refused_when_called_raw() -> None:
    """Each call of the filter's list, made through ctypes' syscall(), fails with EPERM (clone3: ENOSYS).

    The numbers come from libseccomp on this side, for this machine's architecture. The calls that
    would start a process are left to the tests above (were one let through, it would fork here).
    """
    lib = sandbox._libseccomp()
    spawning = {"fork", "vfork", "execve", "execveat"}
    numbers = {name: lib.seccomp_syscall_resolve_name(name.encode()) for name in (*sandbox.DENIED_SYSCALLS, "clone3")}
    numbers = {name: number for name, number in numbers.items() if number >= 0 and name not in spawning}
    code = (
        "ctypes = __import__('ctypes')\nlibc = ctypes.CDLL(None, use_errno=True)\nfailed = {}\n"
        f"for name, number in {numbers!r}.items():\n"
        "    failed[name] = (libc.syscall(number, 0, 0, 0, 0, 0), ctypes.get_errno())\nprint(failed)"
    )
    failed = ast.literal_eval(seen(DISARM + code)["output"])
    assert failed == {name: (-1, 38 if name == "clone3" else 1) for name in numbers}, failed


LEGITIMATE = {
    "input()": "print(input())",
    "sys.stdin": "import sys\nprint(sys.stdin.readline().strip())",
    "sys.stdin.read()": "import sys\nprint(sys.stdin.read().strip())",
    # LiveCodeBench mocks builtins.open (the preamble's `from builtins import *` binds the real one first)
    "builtins.open(0)": "import builtins\nprint(builtins.open(0).read().strip())",
    "exit() after the answer": "print(input())\nexit()",
    "quit() after the answer": "print(input())\nquit()",
    "a main guard": "def main():\n    print(input())\n\nif __name__ == '__main__':\n    main()",
    "randomness and clocks": "import os, random, time, datetime\nrandom.seed(os.urandom(8))\n"
    "time.sleep(0.01)\nassert datetime.datetime.now() and time.perf_counter()\nprint(input())",
    "a temporary file": "import tempfile\nwith tempfile.TemporaryFile('w+') as f:\n    f.write(input())\n"
    "    f.seek(0)\n    print(f.read())",
    "threads": "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(4) as pool:\n"
    "    print(sum(pool.map(int, [input(), '0', '0'])))",
}


@pytest.mark.parametrize("code", LEGITIMATE.values(), ids=LEGITIMATE.keys())
def test_what_solutions_legitimately_do_still_passes(code: str) -> None:
    verdict = graded(code, TWO)
    assert verdict.passed, verdict


# --- the rest: network, memory, time, disk ------------------------------------------------------------------

NETWORK = {
    "socket.create_connection": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
    "_socket with the hook disarmed": DISARM + "import _socket\n_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)",
    "a unix socket pair": DISARM + "import socket\nsocket.socketpair()",
    "a netlink socket": DISARM + "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
}


@pytest.mark.parametrize("attack", NETWORK.values(), ids=NETWORK.keys())
def test_no_socket_of_any_kind(attack: str) -> None:
    verdict = graded(attack + "\nprint(1)")
    assert not verdict.passed and re.search("not allowed|PermissionError", verdict.reason), verdict


def test_memory_is_limited() -> None:
    verdict = graded("x = bytearray(4 << 30)\nprint(1)")
    assert not verdict.passed and "MemoryError" in verdict.reason, verdict


@pytest.mark.parametrize(
    "attack",
    [
        "while True:\n    pass",
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
        "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\ntime.sleep(600)",
    ],
    ids=["a loop", "a loop that ignores the alarm", "a sleep that blocks the alarm"],
)
def test_time_is_limited_even_when_the_alarm_is_ignored(attack: str) -> None:
    start = time.monotonic()
    verdict = graded(attack)
    assert not verdict.passed and verdict.reason == "timeout", verdict
    assert time.monotonic() - start < QUICK.wall_s() + 2 and not runners_left()


@pytest.mark.parametrize(
    "attack",
    ["for i in range(64):\n    open(f'f{i}', 'wb').write(bytes(1 << 20))", "open('big', 'wb').write(bytes(64 << 20))"],
    ids=["many files", "one large file"],
)
def test_disk_is_limited(attack: str) -> None:
    verdict = graded(attack + "\nprint(1)")
    assert not verdict.passed and "OSError" in verdict.reason, verdict


# --- refusing to grade weakly --------------------------------------------------------------------------------


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    sandbox._unavailable.cache_clear()
    sandbox.seccomp_program.cache_clear()
    yield
    sandbox._unavailable.cache_clear()
    sandbox.seccomp_program.cache_clear()


def test_without_bubblewrap_nothing_is_graded(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "BWRAP", "evb-no-such-bwrap")
    message = refused(sandbox.check_available, "bubblewrap")
    assert message.endswith("install it: apt-get install bubblewrap")
    refused(lambda: grade("print(1)", ONE, None, QUICK), "bubblewrap")
    task = LiveCodeBenchTask(data_file=str(FIXTURE))
    refused(lambda: task.examples(Tokenizer()), "bubblewrap")


def test_without_user_namespaces_nothing_is_graded(
    fresh_probe: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # bwrap's own words where the kernel allows no unprivileged user namespace
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    message = refused(sandbox.check_available, "No permissions to creating new namespace")
    assert "allow unprivileged user namespaces" in message


def test_without_seccomp_nothing_is_graded(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "LIBSECCOMP", "libevb-no-such-seccomp.so.2")
    assert refused(sandbox.check_available, "libseccomp").endswith("install it: apt-get install libseccomp2")
    sandbox.seccomp_program.cache_clear()
    sandbox._unavailable.cache_clear()
    # a filter the kernel rejects (a jump past the end) stands for a kernel without seccomp filters
    monkeypatch.setattr(sandbox, "LIBSECCOMP", "libseccomp.so.2")
    monkeypatch.setattr(sandbox, "seccomp_program", lambda: bytes([5, 0, 0, 0, 9, 0, 0, 0]))
    assert "use a Linux kernel with seccomp filters" in refused(sandbox.check_available, "seccomp")


def test_data_the_sandbox_would_show_is_refused() -> None:
    refused(lambda: sandbox.check_available("/usr/share/evb-data.jsonl"), "/usr/share/evb-data.jsonl")


def test_the_layers_are_in_force_inside() -> None:
    """From inside: nobody, no capability even in the bounding set, no_new_privs, seccomp filter mode."""
    code = (
        "import os, ctypes\nlibc = ctypes.CDLL(None)\nprctl = lambda *a: libc.prctl(*a, 0, 0, 0)\n"
        "print(os.getuid(), os.getgid(), sum(prctl(23, cap) for cap in range(41)), prctl(39, 0), prctl(21, 0))"
    )
    assert seen(DISARM + code)["output"] == f"{sandbox.NOBODY} {sandbox.NOBODY} 0 1 2\n"


def test_a_result_counts_only_from_a_clean_exit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A container that wrote a result but did not end cleanly (killed, crashed) has no result."""
    fake = tmp_path / "bwrap"
    fake.write_text('#!/bin/sh\necho \'{"output": "1\\n"}\'\nkill -9 $$\n')
    fake.chmod(0o755)
    sandbox.check_available()  # probed with the real bwrap, and cached
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    verdict = graded("print(1)")
    assert not verdict.passed and "without a result" in verdict.reason, verdict
