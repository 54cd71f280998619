"""``harness.analysis.results.load_results``: one table from every run folder, refusing ambiguity."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.analysis.results import (
    BASE_COLUMNS,
    IDENTITY,
    MixedTimingsError,
    load_configs,
    load_results,
    one_batch_size,
    parse_run_id,
)
from harness.errors import UserError
from harness.record.files import CorruptRecordsError, DuplicateRecordError

FULL = "tiny__full-aaaa1111__ruler-bbbb2222__rho0.9__seed0"
INERTIA = "tiny__inertia-cccc3333__ruler-bbbb2222__rho0.9__seed0"


def record(
    run_id: str, example_id: str, score: float, subtask: str = "niah_single_1", meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    parts = parse_run_id(run_id)
    return {
        "run_id": run_id,
        "model": parts["model"],
        "method": parts["method"],
        "task": parts["task"],
        "subtask": subtask,
        "rho": float(parts["rho"]),
        "seed": int(parts["seed"]),
        "example_id": example_id,
        "prediction": "42",
        "answers": ["42"],
        "metrics": {"string_match": score, "exact": 1.0},
        "prefill_len": 100,
        "budget": 10,
        "cache_len_final": 12,
        "kv_bytes_final": 1200,
        "kv_bytes_full": 10000,
        "prefill_s": 0.1,
        "decode_s": 0.2,
        "new_tokens": 3,
        "decode_tokens_per_s": None,
        "score_s": 0.01,
        "evict_s": 0.02,
        "meta": {"length": 2048, "needles": ["a", "b"]} if meta is None else meta,
    }


def write_run(root: Path, run_id: str, records: list[dict[str, Any]], tail: str = "") -> Path:
    folder = root / run_id
    folder.mkdir(parents=True)
    path = folder / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_loads_two_runs(tmp_path: Path) -> None:
    write_run(tmp_path, FULL, [record(FULL, "e0", 1.0), record(FULL, "e1", 0.0)])
    write_run(tmp_path, INERTIA, [record(INERTIA, "e0", 0.5)])
    (tmp_path / FULL / "config.yaml").write_text("method:\n  name: full\n  alpha: 0.8\nrho: 0.9\n")

    frame = load_results(tmp_path)

    assert len(frame) == 3
    assert list(frame.columns[: len(BASE_COLUMNS)]) == list(BASE_COLUMNS)
    row = frame[(frame.method == "inertia") & (frame.example_id == "e0")].iloc[0]
    assert row.method_params == "cccc3333"
    assert row.task_params == "bbbb2222"
    assert row.primary_metric == "string_match"
    assert row.score == 0.5
    assert row["metric.string_match"] == 0.5
    assert row["metric.exact"] == 1.0
    assert row.rho == 0.9 and row.seed == 0
    assert row["meta.length"] == 2048
    assert "meta.needles" not in frame.columns  # non-scalar meta stays out of the table
    assert row.source == str(tmp_path / INERTIA / "records.jsonl")
    # None (a one-token answer's throughput) becomes NaN in a numeric column.
    assert frame.decode_tokens_per_s.isna().all()
    assert frame.prefill_len.dtype.kind in "if"
    assert not frame.duplicated(list(IDENTITY)).any()
    assert load_configs(tmp_path) == {FULL: {"method": {"name": "full", "alpha": 0.8}, "rho": 0.9}}


def test_same_identity_in_two_folders_names_both_files(tmp_path: Path) -> None:
    # Same identity (the task hash differs, so the folders differ): an error, not a choice.
    other = FULL.replace("bbbb2222", "dddd4444")
    first = write_run(tmp_path, FULL, [record(FULL, "e0", 1.0), record(FULL, "e1", 1.0)])
    second = write_run(tmp_path, other, [record(other, "e1", 0.0)])

    with pytest.raises(DuplicateRecordError) as caught:
        load_results(tmp_path)

    message = str(caught.value)
    assert str(first) in message and str(second) in message
    assert "example_id='e1'" in message


def test_corrupt_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_run(tmp_path, FULL, [record(FULL, "e0", 1.0)])
    with path.open("a") as handle:
        handle.write('{"example_id": "e1", "metrics": \n')
        handle.write(json.dumps(record(FULL, "e2", 1.0)) + "\n")

    with pytest.raises(CorruptRecordsError, match=rf"{path}:2:"):
        load_results(tmp_path)


def test_torn_final_line_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torn = json.dumps(record(FULL, "e1", 1.0))[:40]
    path = write_run(tmp_path, FULL, [record(FULL, "e0", 1.0)], tail=torn)

    with caplog.at_level(logging.WARNING):
        frame = load_results(tmp_path)

    assert frame.example_id.tolist() == ["e0"]
    assert "torn final line" in caplog.text
    assert path.read_text().endswith(torn)  # loading reads; it never repairs files


def test_hidden_and_non_run_folders_are_skipped(tmp_path: Path) -> None:
    write_run(tmp_path, FULL, [record(FULL, "e0", 1.0)])
    write_run(tmp_path, ".hydra", [{"garbage": True}])
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "table1.md").write_text("| |\n")

    frame = load_results(tmp_path)

    assert frame.run_id.tolist() == [FULL]


def test_empty_or_missing_root_gives_empty_table(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "absent"):
        frame = load_results(root)
        assert frame.empty
        assert list(frame.columns) == list(BASE_COLUMNS)


def test_run_id_parsing() -> None:
    assert parse_run_id("org__model__h2o-0a1b2c3d__ruler-ffffffff__rho0.5__seed3") == {
        "model": "org__model",
        "model_params": None,
        "method": "h2o",
        "method_params": "0a1b2c3d",
        "task": "ruler",
        "task_params": "ffffffff",
        "rho": "0.5",
        "seed": "3",
    }
    assert (
        parse_run_id("tiny_llama-0a1b2c3d__h2o-0a1b2c3d__ruler-ffffffff__rho0.5__seed3")["model_params"] == "0a1b2c3d"
    )
    with pytest.raises(ValueError, match="not a run id"):
        parse_run_id("no-run-id-here")


def test_timings_of_one_batch_size_pass_and_a_mix_is_refused_naming_the_runs(tmp_path: Path) -> None:
    # Records from before batching carry no batch size: they were decoded alone, like batch 1.
    write_run(tmp_path, FULL, [record(FULL, "e0", 1.0, meta={"length": 2048}), record(FULL, "e1", 1.0)])
    write_run(tmp_path, INERTIA, [record(INERTIA, "e0", 1.0, meta={"length": 2048, "batch_size": 1})])
    frame = load_results(tmp_path)
    assert one_batch_size(frame, "the figure") is frame
    assert one_batch_size(frame.drop(columns="meta.batch_size"), "the figure").equals(
        frame.drop(columns="meta.batch_size")
    )

    (tmp_path / INERTIA / "records.jsonl").unlink()
    write_run(tmp_path / "b8", INERTIA, [record(INERTIA, "e0", 1.0, meta={"length": 2048, "batch_size": 8})])
    mixed = pd.concat([load_results(tmp_path), load_results(tmp_path / "b8")], ignore_index=True)
    with pytest.raises(MixedTimingsError) as caught:
        one_batch_size(mixed, "the figure")
    message = str(caught.value)
    assert message.startswith("the figure would mix timings decoded at batch sizes [1, 8]: runs ")
    assert f"{FULL} (1)" in message and f"{INERTIA} (8)" in message
    assert "rerun them at one batch_size into a fresh results_dir" in message


def test_make_tables_refuses_a_cost_table_that_mixes_batch_sizes(tmp_path: Path) -> None:
    from harness.analysis.__main__ import main

    # Figure 6's RULER length: the cost table compares prefill_s and decode tok/s across rows.
    write_run(tmp_path, FULL, [record(FULL, "e0", 1.0, meta={"length": 2048, "batch_size": 1})])
    write_run(tmp_path, INERTIA, [record(INERTIA, "e0", 1.0, meta={"length": 2048, "batch_size": 4})])
    with pytest.raises(UserError, match=r"table inertia_costs would mix timings decoded at batch sizes \[1, 4\]"):
        main([str(tmp_path)])

    (tmp_path / INERTIA / "records.jsonl").write_text(
        json.dumps(record(INERTIA, "e0", 1.0, meta={"length": 2048, "batch_size": 1})) + "\n"
    )
    main([str(tmp_path)])
    assert "inertia_costs" in (tmp_path / "tables" / "index.md").read_text()
