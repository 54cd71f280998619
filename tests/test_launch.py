"""Launching sweeps through submitit: a real local Slurm cluster and submitit's local executor.

Every test runs ``python -m harness.run -m hydra/launcher=...`` as a user would, on the
model-free dialog task (no download, a fraction of a second per example). The Slurm tests
start a private single-node cluster (``harness.slurm_local``: munge, MariaDB, slurmdbd,
slurmctld, slurmd) once for this module and tear it down even when a test fails; it needs
Debian's Slurm packages and root, and fails with the install line when they are missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import CONF_DIR
from harness.slurm_local import LocalSlurm, SlurmLocalError

ROOT = Path(__file__).resolve().parents[1]
# One dialog per example; 64-token turns make an example take 0.2-0.6 s here, so a job is still
# running when it is interrupted right after its first record (a cancelled Slurm job runs on
# for ~2 s until SIGKILL, since submitit ignores the SIGTERM).
DIALOGS = ("task=dialogs", "task.scenarios=[topic_shift]", "task.tokens_per_turn=64", "threads=1")
SWEEP_TIMEOUT = 180


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    cluster = LocalSlurm()
    try:
        cluster.start()
    except SlurmLocalError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


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


def slurm_query(slurm: LocalSlurm, *command: str) -> list[str]:
    return subprocess.run(command, env=slurm.env, capture_output=True, text=True, check=True).stdout.split()


def method_records(results: Path, method: str) -> bytes:
    return next((data for run, data in records_by_run(results).items() if f"__{method}-" in run), b"")


def test_slurm_array_sweep_with_a_requeued_task_writes_every_run_once(slurm, tmp_path):
    """Two configs as one array job; task 0 is requeued mid-run (as on preemption) and resumes."""
    n = 24
    with background_sweep(tmp_path, "slurm_local", f"task.n_dialogs={n}", "method=fdkvc,fifo", env=slurm.env) as sweep:
        wait_for(lambda: b"\n" in method_records(tmp_path, "fdkvc"), "fdkvc's first record")
        [task] = [job for job in slurm_query(slurm, "squeue", "-h", "-o", "%i") if job.endswith("_0")]
        subprocess.run(["scontrol", "requeue", task], env=slurm.env, check=True)
        wait_for(lambda: slurm_query(slurm, "squeue", "-h", "-j", task, "-o", "%T") == ["PENDING"], "the requeue")
        # What the first attempt left; Slurm holds a requeued job ~2 min, which a test skips.
        before = method_records(tmp_path, "fdkvc")
        subprocess.run(["scontrol", "update", f"JobId={task}", "StartTime=now"], env=slurm.env, check=True)
        assert sweep.wait(timeout=SWEEP_TIMEOUT) == 0, (tmp_path / "launch.log").read_text()[-4000:]

    done = len(complete_lines(before))
    assert 1 <= done < n, f"task 0 was not requeued mid-run ({done} of {n} records)"
    runs = records_by_run(tmp_path)
    assert sorted(run.split("__")[1].split("-")[0] for run in runs) == ["fdkvc", "fifo"]
    for data in runs.values():
        assert [record["example_id"] for record in complete_lines(data)] == [f"topic_shift/{i:04d}" for i in range(n)]
    assert method_records(tmp_path, "fdkvc").startswith(before), "records written before the requeue changed"
    logs = "".join(path.read_text() for path in tmp_path.glob(".hydra/*/0/run.log"))
    assert f"{n} examples, {done} already recorded, {n - done} to run" in logs
    # One array job (two tasks, both run at once) asking Slurm to requeue it.
    [script] = tmp_path.glob(".hydra/*/.submitit/*/*_submission.sh")
    assert "#SBATCH --array=0-1%2" in script.read_text() and "#SBATCH --requeue" in script.read_text()
    array = task.split("_")[0]
    states = slurm_query(slurm, "sacct", "-n", "-P", "-X", "-D", "-j", array, "-o", "JobID,State")
    assert sorted(states) == [f"{array}_0|COMPLETED", f"{array}_0|REQUEUED", f"{array}_1|COMPLETED"], states


def test_slurm_job_cancelled_mid_run_resumes_without_recomputing(slurm, tmp_path):
    def cancel(sweep: subprocess.Popen) -> None:
        [job] = slurm.jobs()
        subprocess.run(["scancel", job], env=slurm.env, check=True)

    output = interrupt_then_resume(tmp_path, "slurm_local", "fdkvc", 24, cancel, env=slurm.env)
    # With accounting, submitit sees the cancelled job and the multirun fails instead of hanging.
    assert "UncompletedJobError" in output, output[-3000:]
    states = slurm_query(slurm, "sacct", "-n", "-P", "-X", "-o", "State")
    assert any(state.startswith("CANCELLED") for state in states), states


def test_local_executor_sweep_killed_halfway_resumes_without_recomputing(tmp_path):
    def kill_sweep(sweep: subprocess.Popen) -> None:
        # The whole sweep at once: Hydra's process and the local jobs it started share its group.
        os.killpg(sweep.pid, signal.SIGKILL)

    interrupt_then_resume(tmp_path, "local", "fdkvc,fifo", 12, kill_sweep)


def test_missing_slurm_packages_fail_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setattr("harness.slurm_local.shutil.which", lambda name, path=None: None)
    with pytest.raises(SlurmLocalError, match=r"apt-get install -y --no-install-recommends munge slurmctld"):
        LocalSlurm(tmp_path / "cluster").start()


@pytest.mark.parametrize(("preset", "constraint"), [("slurm_h100", "h100"), ("slurm_h200", "h200")])
def test_gpu_presets_request_gpus_an_array_cap_and_requeue(preset, constraint, monkeypatch):
    monkeypatch.setenv("SLURM_PARTITION", "gpu-long")
    monkeypatch.delenv("SLURM_CONSTRAINT", raising=False)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={preset}"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher["partition"] == "gpu-long" and launcher["constraint"] == constraint
    assert launcher["gpus_per_node"] == 1 and launcher["tasks_per_node"] == 1
    assert launcher["additional_parameters"] == {"requeue": True} and launcher["max_num_timeout"] > 0
    assert 1 < launcher["array_parallelism"] < 256
    assert f"export OMP_NUM_THREADS={launcher['cpus_per_task']}" in launcher["setup"]
