"""Records are appended atomically, resumed, and never silently lost or duplicated."""

from __future__ import annotations

import json

import pytest

from harness.record.files import CorruptRecordsError, DuplicateRecordError, RecordFile, read_records


def record(example_id: str, score: float = 1.0) -> dict:
    return {"example_id": example_id, "metrics": {"score": score}}


def test_append_then_reload(tmp_path):
    path = tmp_path / "run" / "records.jsonl"
    records = RecordFile(path)
    records.append(record("a"))
    records.append(record("b", 0.0))
    assert path.read_text().count("\n") == 2
    reloaded = RecordFile(path)
    assert "a" in reloaded and "b" in reloaded and len(reloaded) == 2
    assert [r["example_id"] for r in reloaded.records()] == ["a", "b"]


def test_duplicate_append_is_refused_and_nothing_is_lost(tmp_path):
    path = tmp_path / "records.jsonl"
    records = RecordFile(path)
    records.append(record("a"))
    with pytest.raises(DuplicateRecordError, match="example_id='a' is already recorded"):
        records.append(record("a", 0.0))
    assert read_records(path) == [record("a")]


def test_duplicate_lines_on_disk_are_an_error(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record("a")) + "\n" + json.dumps(record("b")) + "\n" + json.dumps(record("a")) + "\n")
    with pytest.raises(DuplicateRecordError, match="lines 1 and 3 both record example_id='a'"):
        read_records(path)


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record("a")) + "\n{not json\n" + json.dumps(record("b")) + "\n")
    with pytest.raises(CorruptRecordsError, match=r"records.jsonl:2: corrupt record"):
        RecordFile(path)
    path.write_text(json.dumps(record("a")) + "\n[1, 2]\n")
    with pytest.raises(CorruptRecordsError, match=r"records.jsonl:2: not a record"):
        read_records(path)


def test_torn_final_line_is_dropped_and_repaired(tmp_path, caplog):
    path = tmp_path / "records.jsonl"
    whole = json.dumps(record("a")) + "\n"
    path.write_text(whole + '{"example_id": "b", "metr')
    records = RecordFile(path)
    assert len(records) == 1 and "b" not in records
    assert "torn final line" in caplog.text
    assert path.read_text() == whole
    records.append(record("b"))
    assert [r["example_id"] for r in read_records(path)] == ["a", "b"]
