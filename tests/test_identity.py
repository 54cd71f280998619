"""No run id hides a change: data files by content, one rho, the batch size; older folders found and migrated."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from harness.analysis.results import load_results
from harness.analysis.spec import one_per_example
from harness.config import check_top_level, compose_config, resolve_numerics
from harness.errors import UserError
from harness.record.files import DuplicateRecordError, read_records
from harness.record.identity import run_id
from harness.record.migrate import main as migrate_main
from harness.record.migrate import migrate_folder
from harness.record.schema import SCHEMA_VERSION, RunId, digest
from harness.run import execute

FIXTURES = Path(__file__).parent / "fixtures"
TINY = ("model=tiny_llama", "task.lengths=[512]", "threads=1")


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def rid(*overrides: str) -> str:
    cfg = compose_config(*overrides)
    return run_id(cfg, instantiate(cfg.task))


def text_file(path: Path, text: str = "Plain prose. " * 400) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# Every local data option of every task: (the overrides that point it at ``{file}``, how to make the file).
DATA_OPTIONS = {
    "ruler haystack": (("task=ruler", "task.haystack_file={file}"), "text"),
    "ruler qa_1": (("task=ruler", "task.data_files.qa_1={file}"), FIXTURES / "ruler" / "squad_v2_validation.jsonl"),
    "ruler hub copy": (("task=ruler", "task.haystack_hub={{path: x, data_files: '{file}'}}"), "text"),
    "needle haystack": (("task=needle", "task.haystack_file={file}"), "text"),
    "ppl text": (("task=ppl", "task.text_file={file}"), "text"),
    "longbench": (("task=longbench", "task.data_dir={folder}"), FIXTURES / "longbench" / "trec.jsonl"),
    "longbench_v2": (("task=longbench_v2", "task.data_dir={folder}"), FIXTURES / "longbench_v2" / "data.json"),
    "livecodebench": (("task=livecodebench", "task.data_file={file}"), FIXTURES / "livecodebench" / "test6.jsonl"),
    "aime": (
        ("task=aime", "task.data_file={file}", "task.samples=1", "task.competitions=[aime_2024]"),
        FIXTURES / "math" / "aime_2024.jsonl",
    ),
    "lm_eval": (
        (
            "task=lm_eval",
            f"task.include_path={FIXTURES / 'lm_eval' / 'tasks'}",
            "task.tasks=[toy_gen]",
            "+task.data_files.toy_gen={file}",
        ),
        FIXTURES / "lm_eval" / "toy.jsonl",
    ),
}


@pytest.mark.parametrize("name", list(DATA_OPTIONS))
def test_a_data_file_enters_the_run_id_by_its_content(name, tmp_path):
    overrides, source = DATA_OPTIONS[name]
    folder = tmp_path / "data"
    if source == "text":
        file = text_file(folder / "corpus.txt")
    else:
        file = folder / Path(source).name
        file.parent.mkdir(parents=True)
        shutil.copyfile(source, file)

    def at(path: Path) -> str:
        return rid("model=tiny_llama", *(o.format(file=path, folder=path.parent) for o in overrides))

    before = at(file)
    # The same content at another path is the same run.
    elsewhere = tmp_path / "elsewhere" / file.name
    elsewhere.parent.mkdir()
    shutil.copyfile(file, elsewhere)
    assert at(elsewhere) == before
    # The file edited in place is another run: it must not resume into the old folder.
    file.write_bytes(file.read_bytes() + b"\n")
    assert at(file) != before


def test_a_missing_data_file_is_a_users_mistake(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"task\.haystack_file='.*nope\.txt' does not exist — "):
        rid("model=tiny_llama", f"task.haystack_file={tmp_path}/nope.txt")


def test_rho_written_as_an_integer_or_a_float_is_one_run(tmp_path):
    assert rid(*TINY, "rho=0") == rid(*TINY, "rho=0.0")
    assert rid(*TINY, "method=tova", "rho=0") == rid(*TINY, "method=tova", "rho=0.0")
    assert RunId.parse(rid(*TINY, "rho=0")).rho == "0.0"
    cfg = compose_config(*TINY, "task.n=1", "method=full", "rho=0", f"results_dir={tmp_path}")
    folder = tmp_path / execute(cfg)["run_id"]
    assert folder.name.endswith("__rho0.0__seed0")
    assert [r["rho"] for r in read_records(folder / "records.jsonl")] == [0.0]
    # The other spelling resumes the same folder.
    again = compose_config(*TINY, "task.n=1", "method=full", "rho=0.0", f"results_dir={tmp_path}")
    assert execute(again)["run_id"] == folder.name


def test_the_batch_size_above_one_is_part_of_the_run_id():
    one, eight = rid(*TINY, "method=tova_decode"), rid(*TINY, "method=tova_decode", "batch_size=8")
    assert one != eight
    assert RunId.parse(one).model_params is None
    assert RunId.parse(eight).model == "tiny_llama" and RunId.parse(eight).model_params is not None
    assert rid(*TINY, "method=tova_decode", "batch_size=1") == one


def test_numerics_other_than_the_reference_are_part_of_the_run_id():
    one, two = rid(*TINY, "method=adakv_ea"), rid(*TINY, "method=adakv_ea", "numerics=2")
    assert one != two and RunId.parse(one).model_params is None
    assert RunId.parse(two).model == "tiny_llama" and RunId.parse(two).model_params is not None
    assert rid(*TINY, "method=adakv_ea", "numerics=1") == one
    assert two != rid(*TINY, "method=adakv_ea", "numerics=2", "batch_size=8")


def test_numerics_auto_is_the_reference_on_a_cpu_and_4_on_a_gpu(monkeypatch):
    cpu = ("model.device=cpu", "method=inertia")
    assert rid(*TINY, *cpu) == rid(*TINY, *cpu, "numerics=auto") == rid(*TINY, *cpu, "numerics=1")
    cfg = compose_config(*TINY, *cpu)
    check_top_level(cfg)
    assert cfg.numerics == 1
    gpu = ("model.device=cuda", "method=inertia")
    assert rid(*TINY, *gpu) == rid(*TINY, *gpu, "numerics=4") != rid(*TINY, *gpu, "numerics=1")
    assert RunId.parse(rid(*TINY, *gpu, "numerics=1")).model_params is not None
    cfg = compose_config(*TINY, *gpu)
    check_top_level(cfg)
    assert cfg.numerics == 4
    # auto follows the device as model.device=auto resolves it: a GPU where one is found.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rid(*TINY, "model.device=auto", "method=inertia") == rid(*TINY, *gpu)
    cuda, cpu_device = torch.device("cuda"), torch.device("cpu")
    assert [resolve_numerics(value, cuda) for value in ("auto", 1, 3)] == [4, 1, 3]
    assert [resolve_numerics(value, cpu_device) for value in ("auto", 2)] == [1, 2]


def test_the_analysis_refuses_a_cell_that_mixes_batch_sizes(tmp_path):
    for batch in ("batch_size=1", "batch_size=2"):
        execute(compose_config(*TINY, "task.n=2", "method=full", "rho=0", batch, f"results_dir={tmp_path}"))
    frame = load_results(tmp_path)
    assert len(frame) == 4 and frame["model_params"].nunique(dropna=False) == 2
    frame["variant"] = "full"
    with pytest.raises(DuplicateRecordError, match="several records of example"):
        one_per_example(frame)


# --- Folders made under the previous rules (schema version 1) -------------------------------------------------


def as_version_1(folder: Path, task_identity: dict | None = None, rho: object = None, batch: int | None = None) -> Path:
    """``folder`` rewritten as the previous version wrote it: no version field, the given task identity / rho.

    ``batch``: the records say they were decoded at that batch size, while the identity and the
    folder name are batch 1's (batch size was not part of the run id).
    """
    records = read_records(folder / "records.jsonl")
    run = RunId.parse(folder.name)
    if task_identity is not None:
        run = RunId(**{**run.__dict__, "task_params": digest(task_identity)})
    if rho is not None:
        run = RunId(**{**run.__dict__, "rho": str(rho)})
    if batch is not None:
        run = RunId(**{**run.__dict__, "model_params": None})
    lines = []
    for record in records:
        record.pop("schema_version")
        record["run_id"] = str(run)
        if task_identity is not None:
            record["identity"]["task"] = task_identity
        if rho is not None:
            record["rho"] = rho
        if batch is not None:
            record["identity"]["model"].pop("batch_size", None)
            record["meta"]["batch_size"] = batch
        lines.append(json.dumps(record) + "\n")
    (folder / "records.jsonl").write_text("".join(lines))
    if rho is not None:
        config = (folder / "config.yaml").read_text().replace("rho: 0.0", f"rho: {rho}")
        (folder / "config.yaml").write_text(config)
    old = folder.parent / str(run)
    folder.rename(old)
    return old


def test_a_folder_of_an_older_identity_is_refused_then_migrated(tmp_path, capsys):
    hay = text_file(tmp_path / "hay.txt")
    haystack = ("task.tasks=[niah_single_2]", f"task.haystack_file={hay}")
    cfg = compose_config(*TINY, *haystack, "task.n=2", "method=tova", f"results_dir={tmp_path / 'r'}")
    folder = tmp_path / "r" / execute(cfg)["run_id"]
    v1_task = {**read_records(folder / "records.jsonl")[0]["identity"]["task"], "haystack_file": str(hay)}
    old = as_version_1(folder, task_identity=v1_task)
    assert not folder.exists()

    rerun = compose_config(*TINY, *haystack, "task.n=3", "method=tova", f"results_dir={tmp_path / 'r'}")
    with pytest.raises(UserError, match=rf"{old} holds records of this run under an older run id .* — re-identify it"
                       rf" with `python -m harness.record.migrate {tmp_path / 'r'}`"):  # fmt: skip
        execute(rerun)
    assert not folder.exists()

    # The first session's start is kept to the second: a file written within that second is not a change.
    started = datetime.fromisoformat(json.loads((old / "provenance.jsonl").read_text().splitlines()[0])["started_at"])
    os.utime(hay, (started.timestamp() + 0.9,) * 2)
    assert migrate_folder(old) == [f"{old.name} -> {folder.name}: 2 records (2 new there)"]
    assert not old.exists()
    records = read_records(folder / "records.jsonl")
    assert [r["schema_version"] for r in records] == [SCHEMA_VERSION] * 2
    assert {r["run_id"] for r in records} == {folder.name}
    assert records[0]["identity"]["task"]["haystack_file"].startswith("sha256:")
    assert "migrated_from" in (folder / "provenance.jsonl").read_text()
    # The rerun now resumes: only the third example runs.
    assert execute(rerun)["n"] == 3
    # A data file that changed after the records were made cannot be re-identified.
    again = as_version_1(folder, task_identity=v1_task)
    hay.write_text("Other prose. " * 400)
    os.utime(hay, (started.timestamp() + 1,) * 2)
    with pytest.raises(UserError, match=r"changed after they were made"):
        migrate_folder(again)


def test_migration_merges_the_two_spellings_of_rho_and_splits_batch_sizes(tmp_path, capsys):
    results = tmp_path / "r"
    cfg = compose_config(*TINY, "task.n=2", "method=tova_decode", "rho=0", f"results_dir={results}")
    folder = results / execute(cfg)["run_id"]
    old = as_version_1(folder, rho=0)
    assert old.name.endswith("__rho0__seed0")
    with pytest.raises(UserError, match="older run id"):
        execute(compose_config(*TINY, "task.n=2", "method=tova_decode", "rho=0.0", f"results_dir={results}"))

    batched = compose_config(*TINY, "task.n=3", "method=tova", "batch_size=2", f"results_dir={results}")
    split = as_version_1(results / execute(batched)["run_id"], batch=2)
    single = compose_config(*TINY, "task.n=4", "method=tova", f"results_dir={results}")
    with pytest.raises(UserError, match="schema version 1, which today's rules"):
        execute(single)

    migrate_main([str(results)])
    # The two spellings of rho are one folder now; the batch-2 records left the batch-1 folder for their own.
    batched_id = execute(batched)["run_id"]
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith(".")) == sorted([folder.name, batched_id])
    assert len(read_records(results / batched_id / "records.jsonl")) == 3
    assert execute(single)["run_id"] == split.name
    # Nothing left to do: a rerun of the migration changes nothing.
    migrate_main([str(results)])
    assert "0 run folder(s) re-identified" in capsys.readouterr().err


def test_a_record_of_a_future_version_is_refused(tmp_path):
    folder = tmp_path / "tiny_llama__tova-6d526e4e__ruler-ae427061__rho0.5__seed0"
    folder.mkdir()
    (folder / "records.jsonl").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "example_id": "a"}) + "\n")
    with pytest.raises(ValueError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than .* — upgrade evictbench"):
        read_records(folder / "records.jsonl")


def test_a_folder_of_schema_version_2_moves_where_version_3_puts_it(tmp_path):
    results = tmp_path / "r"
    cfg = compose_config(*TINY, "task.n=2", "method=inertia", "rho=0.5", f"results_dir={results}")
    folder = results / execute(cfg)["run_id"]
    # As version 2 wrote it: rho inside the method hash, the aggregators in one module.
    config = (folder / "config.yaml").read_text().replace("methods.aggregators.ema.EMA", "methods.aggregation.EMA")
    (folder / "config.yaml").write_text(config)
    lines = []
    for record in read_records(folder / "records.jsonl"):
        record["schema_version"] = 2
        record["identity"]["method"]["selection"]["rho"] = 0.5
        record["identity"]["method"]["aggregator"]["_target_"] = "methods.aggregation.EMA"
        lines.append(json.dumps(record) + "\n")
    (folder / "records.jsonl").write_text("".join(lines))
    old = folder.rename(results / folder.name.replace("inertia-", "inertia-0000"))
    with pytest.raises(UserError, match="older run id"):
        execute(cfg)
    assert migrate_folder(old) == [f"{old.name} -> {folder.name}: 2 records (2 new there)"]
    assert execute(compose_config(*TINY, "task.n=2", "method=inertia", "rho=0.5", f"results_dir={results}"))["n"] == 2
    assert "rho" not in json.dumps(read_records(folder / "records.jsonl")[0]["identity"]["method"])
