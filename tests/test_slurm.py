"""Sweeps on a real local Slurm cluster: an array job with a requeued task, a job cancelled mid-run.

The module starts a private single-node cluster (``scripts/slurm_local.py``: munge, MariaDB,
slurmdbd, slurmctld, slurmd) once and tears it down even when a test fails. It needs
Debian's Slurm packages and root: without them the whole module is skipped with the reason
(one line in the summary), and fails instead under ``EVICTBENCH_REQUIRE_SLURM=1``, as CI sets it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_local import APT_PACKAGES, LocalSlurm, SlurmLocalError, missing_binaries
from sweeps import SWEEP_TIMEOUT, background_sweep, complete_lines, interrupt_then_resume, records_by_run, wait_for

_MISSING = missing_binaries()
if _MISSING or os.geteuid() != 0:
    # `make test` installs the packages when it can (root with apt-get); elsewhere these tests
    # are skipped with the reason, except in CI, where a skip would hide them.
    _WHY = f"Debian's {APT_PACKAGES} (missing {', '.join(_MISSING)})" if _MISSING else "root (slurmd runs as root)"
    _REASON = f"real-Slurm tests need {_WHY}: run `make test` as root, or install them"
    if os.environ.get("EVICTBENCH_REQUIRE_SLURM") == "1":
        pytest.fail(_REASON, pytrace=False)
    pytest.skip(_REASON, allow_module_level=True)


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
    expected = [f"{array}_0|COMPLETED", f"{array}_0|REQUEUED", f"{array}_1|COMPLETED"]

    def states() -> list[str]:
        return sorted(slurm_query(slurm, "sacct", "-n", "-P", "-X", "-D", "-j", array, "-o", "JobID,State"))

    # slurmdbd records a job's end a moment after the job has ended: a loaded machine sees RUNNING first.
    wait_for(lambda: states() == expected, f"sacct to record {expected}", timeout=60)


def test_slurm_job_cancelled_mid_run_resumes_without_recomputing(slurm, tmp_path):
    def cancel(sweep: subprocess.Popen) -> None:
        [job] = slurm.jobs()
        subprocess.run(["scancel", job], env=slurm.env, check=True)

    output = interrupt_then_resume(tmp_path, "slurm_local", "fdkvc", 24, cancel, env=slurm.env)
    # With accounting, submitit sees the cancelled job and the multirun fails instead of hanging.
    assert "UncompletedJobError" in output, output[-3000:]
    states = slurm_query(slurm, "sacct", "-n", "-P", "-X", "-o", "State")
    assert any(state.startswith("CANCELLED") for state in states), states
