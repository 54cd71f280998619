"""A private single-node Slurm cluster on this machine, for testing the Slurm launch path.

Starts munged, a MariaDB server, slurmdbd, slurmctld and slurmd, all with their own files
under one directory (config, state, spool, logs, sockets, database) and their own ports, so
nothing in ``/etc`` or ``/var`` is read or written and a second cluster (another test
session) can run beside it. Every Slurm client finds the cluster through ``SLURM_CONF``,
which submitit, Hydra and sbatch pass on to the jobs.

Accounting (slurmdbd + MariaDB) is not optional here: without ``sacct`` submitit cannot tell
that a job died without writing its result, and a Hydra multirun then waits forever on a
cancelled job. Must run as root (slurmd does). Needs Debian's packages::

    apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client slurmdbd mariadb-server

Command line::

    python scripts/slurm_local.py start [--dir DIR]   # prints the export line for SLURM_CONF
    python scripts/slurm_local.py stop --dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

APT_PACKAGES = "munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
BINARIES = (
    "munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd",
    "sbatch", "squeue", "scancel", "sinfo", "sacct", "sacctmgr", "scontrol",
)  # fmt: skip
# Start order; stopped in reverse.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
CLUSTER = "evictbench"
PARTITION = "debug"


class SlurmLocalError(RuntimeError):
    """The local cluster could not be started (missing packages, busy ports, a daemon failed)."""


def missing_binaries() -> list[str]:
    """The executables this cluster needs that are not on ``PATH`` (``/usr/sbin`` included)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in BINARIES if shutil.which(name, path=path) is None]


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick, so parallel sessions differ)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    """Running and not a zombie: a daemon reparented to a non-reaping init lingers as ``Z``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SlurmLocalError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class LocalSlurm:
    """One cluster: ``with LocalSlurm() as cluster: subprocess.run([...], env=cluster.env)``.

    ``start`` wipes ``root`` first (stale state would restart job ids or replay old jobs);
    ``stop`` cancels every job, stops the daemons by their PID files and, when the directory
    was created here, removes it.
    """

    def __init__(self, root: Path | None = None, timeout: float = 60.0) -> None:
        # Short path: the munge and MariaDB unix sockets live inside it (108-byte limit).
        self._owns_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="evb-slurm-", dir="/tmp"))
        self.timeout = timeout
        self.conf = self.root / "etc" / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self._mariadb: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus ``SLURM_CONF`` and the sbin directories on ``PATH``."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PATH": os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]),
        }

    def _path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def _pid(self, daemon: str) -> int | None:
        try:
            folder = "munge" if daemon == "munged" else "run"
            return int(self._path(folder, f"{daemon}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for error messages."""
        out = []
        for log in sorted([*self._path("log").glob("*.log"), *self._path("munge").glob("*.log")]):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)

    # --- start -------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start every daemon and wait until a job can be submitted and accounted."""
        missing = missing_binaries()
        if missing:
            raise SlurmLocalError(
                f"the local Slurm cluster needs {', '.join(missing)}: install Debian's packages with\n"
                f"  apt-get install -y --no-install-recommends {APT_PACKAGES}"
            )
        if os.geteuid() != 0:
            raise SlurmLocalError("the local Slurm cluster must run as root (slurmd does)")
        if self.root.exists():
            shutil.rmtree(self.root)
        for sub in ("etc", "state", "spool", "log", "run", "db", "munge"):
            self._path(sub).mkdir(parents=True)
        # munged and slurmd run as other users or check parent permissions: traversable, not writable.
        self.root.chmod(0o755)
        self.ports = {name: free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb")}
        busy = [f"{name}:{port}" for name, port in self.ports.items() if port_open(port)]
        if busy:
            raise SlurmLocalError(f"ports already in use: {', '.join(busy)}")
        try:
            self._start_munge()
            self._start_mariadb()
            self._write_configs()
            self._daemon("slurmdbd", ["slurmdbd"], self.ports["slurmdbd"])
            self._daemon("slurmctld", ["slurmctld"], self.ports["slurmctld"])
            self._daemon("slurmd", ["slurmd", "-N", self.host], self.ports["slurmd"])
            _wait(self._node_idle, self.timeout, "the node to become idle")
            _wait(self._cluster_registered, self.timeout, "slurmctld to register with slurmdbd")
        except (SlurmLocalError, OSError, subprocess.SubprocessError) as error:
            tails = self.log_tails()
            self.stop(remove=False)
            raise SlurmLocalError(f"local Slurm did not start ({error}); logs under {self.root}:\n{tails}") from error
        return self

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        key = self._path("munge", "munge.key")
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (self._path("munge"), key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self._path("munge").chmod(0o755)
        socket_path = self._path("munge", "munge.socket")
        # munged runs as munge, so its PID file goes in munge's own folder.
        munged = [
            "runuser", "-u", "munge", "--", "munged", f"--socket={socket_path}", f"--key-file={key}",
            f"--pid-file={self._path('munge', 'munged.pid')}", f"--log-file={self._path('munge', 'munged.log')}",
            f"--seed-file={self._path('munge', 'munged.seed')}",
        ]  # fmt: skip
        self._call(munged)
        _wait(socket_path.exists, self.timeout, "munged's socket")

    def _start_mariadb(self) -> None:
        datadir = self._path("db")
        self._call(
            ["mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root", "--skip-test-db"],
            timeout=120,
        )
        # No grant checks: the server is private to this directory and bound to 127.0.0.1.
        mariadbd = [
            "mariadbd", "--no-defaults", f"--datadir={datadir}", "--user=root", "--bind-address=127.0.0.1",
            f"--port={self.ports['mariadb']}", f"--socket={self._path('run', 'mariadb.sock')}",
            f"--pid-file={self._path('run', 'mariadbd.pid')}", f"--log-error={self._path('log', 'mariadb.log')}",
            "--skip-grant-tables", "--innodb-buffer-pool-size=32M",
        ]  # fmt: skip
        self._mariadb = subprocess.Popen(
            mariadbd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

        def listening() -> bool:
            if self._mariadb.poll() is not None:
                raise SlurmLocalError(f"mariadbd exited with {self._mariadb.returncode}")
            return port_open(self.ports["mariadb"])

        _wait(listening, self.timeout, "MariaDB to listen")

    def _write_configs(self) -> None:
        munge_socket = self._path("munge", "munge.socket")
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        total_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
        # slurmd refuses a node whose RealMemory exceeds what it detects itself.
        memory_mb = int(0.9 * total_kb / 1024)
        slurm = {
            "ClusterName": CLUSTER,
            "SlurmctldHost": f"{self.host}(127.0.0.1)",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "SlurmctldPort": self.ports["slurmctld"],
            "SlurmdPort": self.ports["slurmd"],
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={munge_socket}",
            "StateSaveLocation": self._path("state"),
            "SlurmdSpoolDir": self._path("spool"),
            "SlurmctldPidFile": self._path("run", "slurmctld.pid"),
            "SlurmdPidFile": self._path("run", "slurmd.pid"),
            "SlurmctldLogFile": self._path("log", "slurmctld.log"),
            "SlurmdLogFile": self._path("log", "slurmd.log"),
            # No cgroups or systemd here.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": "127.0.0.1",
            "AccountingStoragePort": self.ports["slurmdbd"],
            # AuthInfo does not reach the slurmdbd connection; this does.
            "AccountingStoragePass": munge_socket,
            "SchedulerType": "sched/backfill",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            # Schedule array tasks at once instead of every few seconds.
            "SchedulerParameters": "batch_sched_delay=0,sched_interval=1",
            # submitit ignores SIGTERM, so a cancelled job runs on until SIGKILL, this many seconds later.
            "KillWait": 0,
            "ReturnToService": 2,
            "MpiDefault": "none",
            "MailProg": "/bin/true",
        }
        lines = [f"{key}={value}" for key, value in slurm.items()]
        lines.append(
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN"
        )
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        dbd = {
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={munge_socket}",
            "DbdHost": "localhost",
            "DbdAddr": "127.0.0.1",
            "DbdPort": self.ports["slurmdbd"],
            "SlurmUser": "root",
            "LogFile": self._path("log", "slurmdbd.log"),
            "PidFile": self._path("run", "slurmdbd.pid"),
            "StorageType": "accounting_storage/mysql",
            "StorageHost": "127.0.0.1",
            "StoragePort": self.ports["mariadb"],
            "StorageUser": "root",
            "StorageLoc": "slurm_acct_db",
        }
        dbd_conf = self.conf.with_name("slurmdbd.conf")
        dbd_conf.write_text("".join(f"{key}={value}\n" for key, value in dbd.items()))
        dbd_conf.chmod(0o600)

    def _call(self, command: list[str], timeout: float = 30.0) -> None:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise SlurmLocalError(f"{command[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def _daemon(self, name: str, command: list[str], port: int) -> None:
        """Start a self-daemonizing Slurm daemon and wait for its port."""
        self._call(command)
        _wait(lambda: port_open(port), self.timeout, f"{name} to listen on {port}")

    def _node_idle(self) -> bool:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True).stdout
        return state.strip() == "idle"

    def _cluster_registered(self) -> bool:
        result = subprocess.run(
            ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster,controlport"],
            env=self.env,
            capture_output=True,
            text=True,
        )
        # The control port appears once slurmctld has registered, not just when the row exists.
        return f"{CLUSTER}|{self.ports['slurmctld']}" in result.stdout

    # --- stop --------------------------------------------------------------------------------

    def jobs(self) -> list[str]:
        """Ids of the jobs the controller still knows as pending or running."""
        result = subprocess.run(
            ["squeue", "-h", "-o", "%A", "-t", "PD,R,CG,S"], env=self.env, capture_output=True, text=True, timeout=30
        )
        return result.stdout.split() if result.returncode == 0 else []

    def stop(self, remove: bool | None = None) -> None:
        """Cancel all jobs (their slurmstepd outlives slurmd), then stop the daemons newest first."""
        if self._pid("slurmctld") and _alive(self._pid("slurmctld")):
            jobs = self.jobs()
            if jobs:
                subprocess.run(["scancel", *jobs], env=self.env, capture_output=True, timeout=30)
                with contextlib.suppress(SlurmLocalError):
                    _wait(lambda: not self.jobs(), 30, "cancelled jobs to end", interval=0.5)
        for daemon in reversed(DAEMONS):
            pid = self._pid(daemon)
            if pid is None or not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            try:
                _wait(lambda pid=pid: not _alive(pid), 15, f"{daemon} ({pid}) to exit")
            except SlurmLocalError:
                os.kill(pid, signal.SIGKILL)
        if self._mariadb is not None:
            self._mariadb.wait(timeout=15)
            self._mariadb = None
        if remove if remove is not None else self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """``start`` prints the ``export SLURM_CONF=...`` line to eval; ``stop`` tears the cluster down."""
    parser = argparse.ArgumentParser(prog="python scripts/slurm_local.py", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, default=Path("/tmp/evb-slurm"), help="cluster directory (wiped on start)")
    args = parser.parse_args(argv)
    cluster = LocalSlurm(args.dir)
    if args.action == "start":
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop(remove=True)


if __name__ == "__main__":
    main()
