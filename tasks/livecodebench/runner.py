"""Runs one model-written solution on test inputs; executed inside the sandbox as ``python -I runner.py``.

Reads a JSON job on stdin: ``{"code", "mode" ("stdin" or "functional"), "fn_name", "inputs",
"timeout", "root"}``. Before the solution runs, an audit hook (PEP 578) refuses what a solution
never needs: sockets, new processes, signals to others, native libraries through ctypes, and
writes outside ``root`` (the sandbox's temporary folder); the process limits and namespaces of
``tasks.livecodebench.sandbox`` hold whatever gets past it. The solution is compiled as
LiveCodeBench's ``testing_util`` does (its import preamble; stdin programs wrapped in a function
called once per test with that test's input as stdin) and each test's result goes out as one JSON
line on a private copy of the original stdout: ``{"output": ...}``, ``{"error": ...}`` or
``{"timeout": true}``. Nothing is compared here: the harness compares, so the solution never sees
an expected output.
"""

import ast
import builtins
import contextlib
import io
import json
import os
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


class Refused(Exception):
    """A sandboxed solution asked for something the sandbox does not allow."""


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


def run(job: dict, send) -> None:
    timeout = int(job["timeout"])
    signal.signal(signal.SIGALRM, on_alarm)
    namespace: dict = {"__name__": "solution"}
    functional = job["mode"] == "functional"
    source = PREAMBLE + "\n\n" + job["code"] if functional else as_function(unwrap_main(job["code"]))
    real_open = builtins.open
    signal.alarm(timeout)
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        if functional:
            holder = namespace["Solution"]() if "class Solution" in job["code"] else None
            method = getattr(holder, job["fn_name"]) if holder is not None else namespace[job["fn_name"]]
        else:
            method = namespace["wrapped_function"]
    except BaseException as error:  # the solution's own failure to compile or define what is tested
        signal.alarm(0)
        send({"error": f"compile: {type(error).__name__}: {error}"})
        return
    signal.alarm(0)
    for text in job["inputs"]:
        captured = io.StringIO()
        stdin = io.StringIO(text)
        sys.stdin, sys.stdout = stdin, captured
        # open(0) and /dev/stdin read the test's input, as LiveCodeBench's mocked open does.
        builtins.open = lambda file, *a, _text=text, **k: (
            io.StringIO(_text) if file in (0, "/dev/stdin") else real_open(file, *a, **k)
        )
        signal.alarm(timeout)
        try:
            if functional:
                arguments = [json.loads(line) for line in text.split("\n")]
                result = method(*arguments)
                result = list(result) if isinstance(result, tuple) else result
            else:
                with contextlib.suppress(SystemExit):
                    method()
                result = captured.getvalue()
            signal.alarm(0)
            outcome = {"output": result}
        except Timeout:
            outcome = {"timeout": True}
        except BaseException as error:
            signal.alarm(0)
            outcome = {"error": f"{type(error).__name__}: {error}"}
        finally:
            signal.alarm(0)
            builtins.open = real_open
            sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__
        send(outcome)
        if "output" not in outcome:
            return


def main() -> None:
    job = json.loads(sys.stdin.read())
    channel = os.fdopen(os.dup(1), "w")
    # Raw writes to descriptor 1 by the solution go nowhere; only the runner writes results.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)

    def send(outcome: dict) -> None:
        channel.write(json.dumps(outcome, default=repr) + "\n")
        channel.flush()

    guard(job["root"])
    run(job, send)


if __name__ == "__main__":
    main()
