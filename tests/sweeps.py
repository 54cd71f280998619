"""Running sweeps as a user would: ``python -m harness.run -m hydra/launcher=...`` on the dialog task.

The model-free dialog task takes a fraction of a second per example, so a sweep is quick and
a job is still running when a test interrupts it right after its first record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# One dialog per write, one step per token; 64-token turns make an example take 0.2-0.6 s here, so
# a job is still running when it is interrupted right after its first record (a cancelled Slurm
# job runs on for ~2 s until SIGKILL, since submitit ignores the SIGTERM).
DIALOGS = (
    "task=dialogs",
    "task.scenarios=[topic_shift]",
    "task.tokens_per_turn=64",
    "task.step=token",
    "task.batch_size=1",
    "threads=1",
)
SWEEP_TIMEOUT = 180


def sweep_command(results: Path, launcher: str, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "harness.run", "-m", f"hydra/launcher={launcher}", *DIALOGS, *overrides,
        f"results_dir={results}",
    ]  # fmt: skip


def run_sweep(results: Path, launcher: str, *overrides: str, env: dict[str, str] | None = None) -> str:
    """Run a multirun to completion and return its output; fail the test if it fails."""
    result = subprocess.run(
        sweep_command(results, launcher, *overrides),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SWEEP_TIMEOUT,
    )
    assert result.returncode == 0, f"sweep failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result.stderr


@contextmanager
def background_sweep(results: Path, launcher: str, *overrides: str, env: dict[str, str] | None = None):
    """A multirun left running in its own process group (output in ``results/launch.log``); killed on exit."""
    with (results / "launch.log").open("w") as log:
        process = subprocess.Popen(
            sweep_command(results, launcher, *overrides),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def records_by_run(results: Path) -> dict[str, bytes]:
    return {path.parent.name: path.read_bytes() for path in results.glob("*/records.jsonl")}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def complete_lines(data: bytes) -> list[dict]:
    """Every line of a records file, asserting there is no torn one."""
    assert data.endswith(b"\n"), f"torn final line: {data[-120:]!r}"
    return [json.loads(line) for line in data.decode().splitlines()]


def interrupt_then_resume(
    results: Path, launcher: str, methods: str, n: int, interrupt: Callable[[subprocess.Popen], None], env=None
) -> str:
    """Interrupt a sweep of ``n`` dialogs per method at its first record, relaunch it, check nothing is recomputed.

    Returns the interrupted sweep's output.
    """
    overrides = (f"task.n_dialogs={n}", f"method={methods}")
    with background_sweep(results, launcher, *overrides, env=env) as process:
        wait_for(lambda: any(b"\n" in data for data in records_by_run(results).values()), "a first record")
        interrupt(process)
        process.wait(timeout=SWEEP_TIMEOUT)
    before = records_by_run(results)
    done = {run: len(complete_lines(data)) for run, data in before.items()}
    assert done and all(count < n for count in done.values()), f"a job was not interrupted mid-run: {done}"

    run_sweep(results, launcher, *overrides, env=env)
    after = records_by_run(results)
    logs = "".join(path.read_text() for path in results.glob(".hydra/*/*/run.log"))
    for run, data in before.items():
        assert after[run].startswith(data), f"{run}: records written before the interruption changed"
        ids = [record["example_id"] for record in complete_lines(after[run])]
        assert ids == [f"topic_shift/{index:04d}" for index in range(n)]
        assert f"{run}: {n} examples, {done[run]} already recorded, {n - done[run]} to run" in logs
    return (results / "launch.log").read_text()
