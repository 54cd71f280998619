"""Launching sweeps through submitit's local executor, and the cluster launcher presets."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from slurm_local import LocalSlurm, SlurmLocalError
from sweeps import interrupt_then_resume

from harness.config import CONF_DIR


def test_local_executor_sweep_killed_halfway_resumes_without_recomputing(tmp_path):
    def kill_sweep(sweep: subprocess.Popen) -> None:
        # The whole sweep at once: Hydra's process and the local jobs it started share its group.
        os.killpg(sweep.pid, signal.SIGKILL)

    interrupt_then_resume(tmp_path, "local", "fdkvc,fifo", 12, kill_sweep)


def test_missing_slurm_packages_fail_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setattr("slurm_local.shutil.which", lambda name, path=None: None)
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
