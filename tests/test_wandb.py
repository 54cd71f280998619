"""``logger=wandb``: one offline wandb run per job, read back from the run's transaction log."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from harness.config import compose_config
from harness.record.wandb_logger import NullLogger, WandbLogger, open_logger
from harness.run import execute
from tasks.dialogs.task import DialogTask

DIALOGS = ("task=dialogs", "task.scenarios=[topic_shift]", "task.n_dialogs=3", "method=fdkvc", "threads=1")


def read_run_log(path: Path) -> list[wandb_internal_pb2.Record]:
    """The records of a ``run-<id>.wandb`` file (wandb's LevelDB-style log: 32 KiB blocks of chunks)."""
    data = path.read_bytes()
    block, header = 32768, 7
    assert data[:4] == b":W&B", f"{path} is not a wandb run log"
    records, pending, position = [], b"", header
    while position + header <= len(data):
        if block - position % block < header:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + header])
        pending += data[position + header : position + header + length]
        position += header + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def offline_run(results: Path) -> list[wandb_internal_pb2.Record]:
    """The records of the one offline run under ``results``, once wandb has flushed them.

    ``run.finish()`` can return before wandb's service has written the run's log: shutting the
    service down waits for it.
    """
    wandb.teardown()
    [path] = results.glob(".wandb/wandb/offline-run-*/run-*.wandb")
    return read_run_log(path)


def history(records: list[wandb_internal_pb2.Record]) -> list[dict]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def only(records: list[wandb_internal_pb2.Record], kind: str):
    [found] = [getattr(record, kind) for record in records if record.WhichOneof("record_type") == kind]
    return found


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return compose_config(*DIALOGS, "logger=wandb", f"results_dir={tmp_path}")


def test_one_offline_run_per_job_with_history_and_summary(offline, tmp_path):
    summary = execute(offline)
    records = offline_run(tmp_path)
    run = only(records, "run")
    assert run.display_name == summary["run_id"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["rho"] == 0.9 and config["task"]["n_dialogs"] == 3 and config["logger"]["mode"] == "offline"
    rows = history(records)
    assert [row["_step"] for row in rows] == [0, 1, 2]
    lines = (tmp_path / summary["run_id"] / "records.jsonl").read_text().splitlines()
    for row, line in zip(rows, lines, strict=True):
        record = json.loads(line)
        assert row["metric/alignment"] == pytest.approx(record["metrics"]["alignment"])
        assert row["cache_len_final"] == record["cache_len_final"]
        assert row["kv_ratio"] == pytest.approx(record["kv_bytes_final"] / record["kv_bytes_full"])
        assert row["decode_s"] == pytest.approx(record["decode_s"])
    summaries = {
        item.key: json.loads(item.value_json)
        for record in records
        if record.WhichOneof("record_type") == "summary"
        for item in record.summary.update
        if item.key
    }
    assert summaries["overall"] == pytest.approx(summary["overall"]) and summaries["n"] == 3
    assert only(records, "exit").exit_code == 0


def test_failing_job_still_finishes_its_run(offline, tmp_path, monkeypatch):
    original = DialogTask.run_batches

    def fails_on_the_second(self, policy, examples):
        yield next(original(self, policy, examples))[:1]
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(DialogTask, "run_batches", fails_on_the_second)
    with pytest.raises(RuntimeError, match="simulated crash"):
        execute(offline)
    assert wandb.run is None, "the failed job's wandb run was left open"
    records = offline_run(tmp_path)
    assert [row["_step"] for row in history(records)] == [0]
    assert only(records, "exit").exit_code == 1


def test_none_is_the_default_and_wandb_missing_is_a_clear_error(monkeypatch, tmp_path):
    assert type(open_logger(compose_config(*DIALOGS), "run")) is NullLogger
    monkeypatch.setitem(sys.modules, "wandb", None)
    tracker = open_logger(compose_config(*DIALOGS, "logger=wandb", f"results_dir={tmp_path}"), "run")
    assert isinstance(tracker, WandbLogger)
    with pytest.raises(ImportError, match=r"logger=wandb needs the wandb package"), tracker:
        pass
