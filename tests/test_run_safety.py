"""Records survive concurrent writers and kills: real processes on one run folder.

- Two processes on one run: the second is refused with the first one's pid, and no example is
  recorded twice.
- Two writers appending the same examples without the run lock still record each once.
- A kill at every point of an example (after its diagnostics line, mid-line, mid-record) leaves
  files that the rerun repairs, and ``make tables`` then reads without an error.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.analysis.diagnostics import read_diagnostics
from harness.analysis.figures import make_figures
from harness.analysis.papers import write_tables
from harness.config import compose_config
from harness.record.files import RecordFile, read_records
from harness.run import execute

ROOT = Path(__file__).resolve().parents[1]
TINY = ("model=tiny_llama", "task.lengths=[512]", "threads=1", "method=inertia", "rho=0.5", "diagnostics=true")


def start(results: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.run", *TINY, *overrides, f"results_dir={results}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_folder(results: Path) -> Path:
    folders = [p for p in results.iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1, folders
    return folders[0]


def test_a_second_process_on_the_same_run_is_refused_and_nothing_is_duplicated(tmp_path):
    first = start(tmp_path, "task.n=100")
    try:
        lock = lambda: next(tmp_path.glob("*/.lock"), None)  # noqa: E731
        wait_for(lambda: lock() is not None and str(first.pid) in lock().read_text(), "the first run's lock")
        second = subprocess.run(
            [sys.executable, "-m", "harness.run", *TINY, "task.n=100", f"results_dir={tmp_path}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert first.poll() is None, "the first run ended before the second started: nothing was tested"
        assert second.returncode == 2, second.stderr[-2000:]
        [line] = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert f"is being written by pid {first.pid} on " in line and " — wait for it to finish" in line
        assert "Traceback" not in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    folder = run_folder(tmp_path)
    ids = [r["example_id"] for r in read_records(folder / "records.jsonl")]
    assert len(ids) == len(set(ids))
    assert [line["example_id"] for line in read_diagnostics(folder)] == ids


def _append_all(path: Path, ids: list[str], ready, go) -> list[bool]:
    records = RecordFile(path)
    ready.set()
    go.wait()
    return [records.append({"example_id": example_id, "metrics": {"score": 1.0}}) for example_id in ids]


def test_two_writers_without_the_run_lock_record_each_example_once(tmp_path):
    path = tmp_path / "records.jsonl"
    ids = [f"x/{i:03d}" for i in range(200)]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        ready = [manager.Event(), manager.Event()]
        go = manager.Event()
        with context.Pool(2) as pool:
            results = [pool.apply_async(_append_all, (path, ids, ready[i], go)) for i in range(2)]
            for event in ready:
                event.wait(60)
            go.set()
            written = [result.get(120) for result in results]
    assert sorted(r["example_id"] for r in read_records(path)) == ids
    # Every example was written by exactly one of the two.
    assert all(a != b for a, b in zip(*written, strict=True))


def tables_and_figures(results: Path) -> None:
    write_tables(results)
    make_figures(results)


def test_every_kill_point_is_repaired_by_the_rerun(tmp_path):
    overrides = (*TINY, f"results_dir={tmp_path}")
    folder = tmp_path / execute(compose_config(*overrides, "task.n=2"))["run_id"]
    records, diagnostics = folder / "records.jsonl", folder / "diagnostics.jsonl"
    whole = diagnostics.read_text().splitlines()
    # Killed after the diagnostics line of a third example, before its record ...
    third = json.loads(whole[0]) | {"example_id": "niah_single_1/512/0002"}
    with diagnostics.open("a") as handle:
        handle.write(json.dumps(third) + "\n")
    tables_and_figures(tmp_path)
    # ... then, on the rerun, in the middle of the diagnostics line of a fourth ...
    execute(compose_config(*overrides, "task.n=3"))
    with diagnostics.open("a") as handle:
        handle.write(whole[1][: len(whole[1]) // 2])
    tables_and_figures(tmp_path)
    # ... and on the next, after a whole diagnostics line, in the middle of the record.
    execute(compose_config(*overrides, "task.n=4"))
    fifth = json.loads(whole[0]) | {"example_id": "niah_single_1/512/0004"}
    record = records.read_text().splitlines()[0]
    with diagnostics.open("a") as handle:
        handle.write(json.dumps(fifth) + "\n")
    with records.open("a") as handle:
        handle.write(record[: len(record) // 3])
    tables_and_figures(tmp_path)
    execute(compose_config(*overrides, "task.n=5"))
    tables_and_figures(tmp_path)
    ids = [r["example_id"] for r in read_records(records)]
    assert ids == [f"niah_single_1/512/{i:04d}" for i in range(5)]
    assert [line["example_id"] for line in read_records(diagnostics)] == ids
    assert records.read_text().endswith("\n") and diagnostics.read_text().endswith("\n")


@pytest.mark.parametrize("kills", [3])
def test_runs_killed_at_random_moments_resume_to_unique_records(tmp_path, kills):
    for attempt in range(kills):
        process = start(tmp_path, "task.n=4")
        # Let it get somewhere: past the model load, sometimes past a record.
        time.sleep(4 + 1.7 * attempt)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    final = start(tmp_path, "task.n=4")
    assert final.wait(timeout=300) == 0, final.stderr.read()[-2000:]
    folder = run_folder(tmp_path)
    ids = [r["example_id"] for r in read_records(folder / "records.jsonl")]
    assert ids == sorted(set(ids)) and len(ids) == 4
    assert [line["example_id"] for line in read_records(folder / "diagnostics.jsonl")] == ids
    tables_and_figures(tmp_path)


# Both processes prepare the same run, then wait for each other just before the run folder is made; three
# rounds, each on a fresh results folder, since where the other process is at that moment varies.
RACER = """
import sys, time
from pathlib import Path
from harness import run
from harness.config import compose_config
from harness.errors import UserError

gate, name, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prepare = run.prepare


def prepare_then_wait(*args):
    plan = prepare(*args)
    (gate / f"{plan.cfg.results_dir[-1]}{name}").touch()
    while len(list(gate.glob(f"{plan.cfg.results_dir[-1]}*"))) < 2:
        time.sleep(0.001)
    return plan


run.prepare = prepare_then_wait
if name == "b":
    # The refused process is slow to word its refusal: what it does after being refused then overlaps the writer's run.
    from harness.record.files import RunLock

    holder = RunLock.holder
    RunLock.holder = lambda self: (time.sleep(0.5), holder(self))[1]
for number in range(rounds):
    try:
        summary = run.execute(compose_config(*sys.argv[4:], f"results_dir={gate.parent}/results{number}"))
        print("done", summary["n"])
    except UserError as error:
        print("refused", error)
"""


def test_two_processes_starting_one_run_together_lose_nothing(tmp_path):
    gate, rounds = tmp_path / "gate", 3
    gate.mkdir()
    overrides = [*TINY[:-1], "task.n=3"]
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(gate), name, str(rounds), *overrides],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name in ("a", "b")
    ]
    outcomes = [racer.communicate(timeout=600) for racer in racers]
    for racer, (_, stderr) in zip(racers, outcomes, strict=True):
        assert racer.returncode == 0, stderr[-3000:]
    for number, lines in enumerate(zip(*(stdout.strip().splitlines() for stdout, _ in outcomes), strict=True)):
        # One wrote the run, the other was told it is being written; the folder the writer used survived.
        done, refused = sorted(lines)
        assert done == "done 3" and refused.startswith("refused ") and "is being written by" in refused, lines
        folder = run_folder(tmp_path / f"results{number}")
        assert [r["example_id"] for r in read_records(folder / "records.jsonl")] == [
            f"niah_single_1/512/{i:04d}" for i in range(3)
        ]


def test_an_internal_error_during_a_run_keeps_its_traceback(tmp_path, monkeypatch):
    from harness import run

    def broken(records):
        raise FileNotFoundError("an internal file went missing")

    monkeypatch.setattr(run, "summarize", broken)
    with pytest.raises(FileNotFoundError, match="an internal file went missing"):
        execute(compose_config(*TINY[:-1], "task.n=1", f"results_dir={tmp_path}"))
