"""Runs one model-written solution on one test; executed inside the sandbox as ``python -I -B /runner.py``.

Reads a JSON job on stdin: ``{"code", "mode" ("stdin" or "functional"), "fn_name", "input",
"timeout", "limits", "seccomp"}``. Before any of the solution runs, it confines itself, in this
order, and refuses to go on when a step fails:

1. its descriptors: the job is read, standard input and output become ``/dev/null`` (standard
   error too, once the solution starts), and the result goes out on a copy of the original stdout;
2. resource limits: CPU seconds, address space, file size, open files, threads, no core dumps;
3. the seccomp filter the harness built (``sandbox.seccomp_program``), checked to be in force;
4. an audit hook (PEP 578) that refuses sockets, new processes, signals, ctypes and writes outside
   the working folder early and with a clear message. The solution can undo the hook; the filter,
   the namespaces and the empty file system of ``tasks.livecodebench.sandbox`` it cannot.

The solution is then compiled as LiveCodeBench's ``testing_util`` does (its import preamble; a
stdin program wrapped in a function called with the test's input as stdin; a functional one
called as ``Solution().<fn_name>(*args)``), and the one result goes out as a JSON line:
``{"output": ...}``, ``{"error": ...}`` or ``{"timeout": true}``, after which the process ends at
once. The solution can reach that copy too; the harness takes from each test's container only one
clean line, so whatever it writes there answers at most the test it was given. Nothing is compared
here: the expected output never enters the sandbox.
"""

import ast
import base64
import builtins
import contextlib
import ctypes
import io
import json
import os
import resource
import signal
import sys

PREAMBLE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

FORBIDDEN_PREFIXES = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "ctypes.", "os.kill")
FORBIDDEN = {"os.fork", "os.forkpty", "os.system", "os.killpg", "os.setuid", "os.putenv", "os.unsetenv", "pty.spawn"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PR_SET_NO_NEW_PRIVS, PR_GET_SECCOMP, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 21, 22, 2


class Refused(Exception):
    """A sandboxed solution asked for something the sandbox does not allow."""


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def limit(limits: dict) -> None:
    """Lower this process's resource limits to the job's (lowering needs no privilege)."""
    memory, size = limits["memory_mb"] << 20, limits["file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))


def confine(program: bytes) -> None:
    """Install the seccomp filter ``program`` (classic BPF) on this process and its future threads."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(code))
    ulong = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), f"no_new_privs: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_SECCOMP, ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ulong(0), ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_GET_SECCOMP, ulong(0), ulong(0), ulong(0), ulong(0)) != SECCOMP_MODE_FILTER:
        raise OSError("seccomp: the filter is not in force")


def guard(root: str) -> None:
    """Install the audit hook: refuse network, processes, ctypes and writes outside ``root``."""
    root = os.path.realpath(root)

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in FORBIDDEN or event.startswith(FORBIDDEN_PREFIXES):
            raise Refused(f"{event} is not allowed in the sandbox")
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS
            if writes and not inside(path):
                raise Refused(f"writing {path!r} outside the sandbox is not allowed")
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime"):
            if not inside(args[0]):
                raise Refused(f"{event} on {args[0]!r} outside the sandbox is not allowed")
        elif event in ("os.rename", "os.link", "os.symlink", "shutil.move", "shutil.copyfile") and not (
            inside(args[0]) and inside(args[1])
        ):
            raise Refused(f"{event} outside the sandbox is not allowed")

    sys.addaudithook(hook)


def unwrap_main(code: str) -> str:
    """A final ``if __name__ == '__main__':`` block runs as plain statements (LiveCodeBench's clean_if_name)."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            return ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except (SyntaxError, IndexError, ValueError):
        pass
    return code


def as_function(code: str) -> str:
    """Imports at the top, every other statement inside ``wrapped_function()`` (LiveCodeBench's make_function)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    body = [s for s in tree.body if not isinstance(s, ast.Import | ast.ImportFrom)] or [ast.Pass()]
    function = ast.FunctionDef(
        name="wrapped_function",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body,
        decorator_list=[],
        lineno=1,
    )
    return PREAMBLE + "\n" + ast.unparse(imports) + "\n" + ast.unparse(ast.fix_missing_locations(function))


class Timeout(Exception):
    pass


def on_alarm(signum: int, frame: object) -> None:
    raise Timeout


def run(job: dict) -> dict:
    """The outcome of the solution on the job's one test."""
    timeout = int(job["timeout"])
    text = job["input"]
    signal.signal(signal.SIGALRM, on_alarm)
    namespace: dict = {"__name__": "solution"}
    functional = job["mode"] == "functional"
    source = PREAMBLE + "\n\n" + job["code"] if functional else as_function(unwrap_main(job["code"]))
    signal.alarm(timeout)
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        if functional:
            holder = namespace["Solution"]() if "class Solution" in job["code"] else None
            method = getattr(holder, job["fn_name"]) if holder is not None else namespace[job["fn_name"]]
        else:
            method = namespace["wrapped_function"]
    except Timeout:
        return {"timeout": True}
    except BaseException as error:  # the solution's own failure to compile or define what is tested
        return {"error": f"compile: {type(error).__name__}: {error}"}
    finally:
        signal.alarm(0)
    captured = io.StringIO()
    sys.stdin, sys.stdout = io.StringIO(text), captured
    # open(0) and /dev/stdin read the test's input, as LiveCodeBench's mocked open does.
    real_open = builtins.open
    builtins.open = lambda file, *a, **k: io.StringIO(text) if file in (0, "/dev/stdin") else real_open(file, *a, **k)
    signal.alarm(timeout)
    try:
        if functional:
            result = method(*[json.loads(line) for line in text.split("\n")])
            return {"output": list(result) if isinstance(result, tuple) else result}
        with contextlib.suppress(SystemExit):
            method()
        return {"output": captured.getvalue()}
    except Timeout:
        return {"timeout": True}
    except BaseException as error:
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        signal.alarm(0)
        builtins.open = real_open
        sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    channel = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # raw writes to descriptor 1 go nowhere, as in LiveCodeBench
    os.close(devnull)
    try:
        limit(job["limits"])
        confine(base64.b64decode(job["seccomp"]))
    except (OSError, ValueError) as error:  # fail closed: no solution runs without every layer
        outcome = {"error": f"sandbox: {error}"}
    else:
        guard(os.getcwd())
        os.dup2(0, 2)  # from here on the solution runs; what it says on stderr is not the harness's business
        outcome = run(job)
    channel.write(json.dumps(outcome, default=repr) + "\n")
    channel.flush()
    # Nothing of the solution (a thread, an atexit handler) runs after its result is out.
    os._exit(0)


if __name__ == "__main__":
    main()
