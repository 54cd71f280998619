"""A user's mistake is one line ``error: <what> — <how to fix>``, exit code 2, no traceback, no run folder.

Every case runs the real command line in a subprocess, as a user would type it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from methods.kvpop import CheckpointInfo, build_scorer, save_checkpoint
from tasks.ruler.task import RulerTask

ROOT = Path(__file__).resolve().parents[1]
MODEL = ("model=tiny_llama", "threads=1")
TINY = (*MODEL, "task.lengths=[512]", "task.n=1")


@dataclass(frozen=True)
class Case:
    """One mistake: the command's arguments, the message expected after ``error: `` (a regex), its env.

    ``harness.run`` cases run on the tiny model and RULER at 512 tokens (``base``) unless they say otherwise.
    """

    args: tuple[str, ...]
    message: str
    module: str = "harness.run"
    env: tuple[tuple[str, str], ...] = ()
    base: tuple[str, ...] = TINY


def files(folder: Path) -> dict[str, Path]:
    """The bad inputs the cases point at."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"file": folder / "a_file"}
    out["file"].write_text("not a folder\n")
    bad = folder / "squad.jsonl"
    bad.write_text('{"title": "x", "paragraphs": []}\n{"title": "y", "paragraphs": [\n')
    out["bad_jsonl"] = bad
    text = folder / "text.safetensors"
    text.write_text("just text\n")
    out["text_ckpt"] = text
    plain = folder / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    out["plain_ckpt"] = plain
    scorer = build_scorer("mlp", 30, 3, 64, gamma_min=0.999, gamma_max=1.0, hidden=8)
    info = CheckpointInfo(
        "smollm2_135m", 30, 3, 64, scorer.hyperparameters(), {"sinks": 4, "window": 8, "k": 16, "bucket": 1}
    )
    out["foreign_ckpt"] = save_checkpoint(scorer, folder / "foreign.safetensors", info)
    corrupt = folder / "corrupt" / "tiny_llama__tova-6d526e4e__ruler-ae427061__rho0.5__seed0"
    corrupt.mkdir(parents=True)
    (corrupt / "records.jsonl").write_text('{"example_id": "a", "metrics": {"s": 1}}\n{"example_id": \n{}\n')
    duplicate = folder / "duplicate" / corrupt.name
    duplicate.mkdir(parents=True)
    line = json.dumps({"example_id": "a", "subtask": "s", "metrics": {"s": 1.0}}) + "\n"
    (duplicate / "records.jsonl").write_text(line + line)
    out["empty"] = folder / "empty.jsonl"
    out["empty"].write_text("")
    out["latin1"] = folder / "latin1.jsonl"
    out["latin1"].write_bytes(b'{"title": "a"}\n{"title": "caf\xe9"}\n')
    return out


def cases(f: dict[str, Path]) -> dict[str, Case]:
    offline = (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"))
    return {
        "rho out of range": Case(("rho=1.5",), r"rho=1\.5 is outside \[0, 1\) — .*rho=0\.9"),
        "rho not a number": Case(("rho=abc",), r"rho='abc' is not a number — "),
        "unknown method": Case(
            ("method=tovaa",), r"method=tovaa is not a config in conf/method/ — choose one of: .*tova"
        ),
        "unknown task": Case(("task=rulerr",), r"task=rulerr is not a config in conf/task/ — choose one of: .*ruler"),
        "unknown model": Case(("model=llama9",), r"model=llama9 is not a config in conf/model/ — .*smollm2_135m"),
        "unknown subtask": Case(("task.tasks=[nia]",), r"'nia'.* — .*niah_single_1"),
        "unknown field": Case(("model.config.foo=1",), r"model\.config\.foo is not in the config — .*\+model"),
        "bad dtype": Case(("model.dtype=float13",), r"model\.dtype='float13' is not a torch dtype — "),
        "budget from rho": Case(("method=snapkv", "rho=0.95"), r"sinks\+window=0\+32=32 — lower rho"),
        "fixed budget": Case(
            ("method=snapkv", "method.selection.budget_tokens=8"),
            r"budget_tokens=8\) is smaller than .* — raise method\.selection\.budget_tokens",
        ),
        "seed": Case(("seed=abc",), r"seed='abc' is not an integer — "),
        "threads": Case(("threads=abc",), r"threads='abc' is not a positive integer — "),
        "numerics": Case(
            ("numerics=5",), r"numerics=5 is not auto or one of 1, 2, 3, 4 — use numerics=auto .*numerics=2, 3 or 4 "
        ),
        "profile": Case(("profile=maybe",), r"profile='maybe' is not true or false — use profile=true"),
        "temperature": Case(
            ("sampling.temperature=hot",), r"sampling\.temperature='hot' is not a finite number >= 0 — "
        ),
        "infinite temperature": Case(
            ("sampling.temperature=inf",), r"sampling\.temperature=inf is not a finite number"
        ),
        "unknown sampling option": Case(("+sampling.foo=1",), r"sampling\.foo is not a sampling option — "),
        "misspelt appended field": Case(
            ("+method.selection.sinkz=4",),
            r"method\.selection\.sinkz is not an option of Selection — did you mean sinks\?",
        ),
        "misspelt appended task field": Case(
            ("+task.lenghts=[1024]",), r"task\.lenghts is not an option of RulerTask — did you mean lengths\?"
        ),
        "misspelt appended option": Case(("+rhoo=0.5",), r"\+rhoo is not an option — did you mean rho\?"),
        "empty results_dir": Case(("results_dir=",), r"results_dir='' is empty — set results_dir to a folder"),
        "a device this torch lacks": Case(
            ("model.device=cuda:7",), r"model\.device='cuda:7' cannot be used here: .* — use"
        ),
        "an empty vocabulary": Case(("model.config.vocab_size=0",), r"model\.config\.vocab_size=0 is not a positive"),
        "KV heads that do not divide": Case(
            ("model.config.num_key_value_heads=3",), r"num_key_value_heads=3 does not divide num_attention_heads=4"
        ),
        "an integer dtype": Case(("model.dtype=int8",), r"model\.dtype='int8' is not a floating-point dtype — "),
        "a weight seed that is no number": Case(("model.seed=abc",), r"model\.seed='abc' is not an integer — "),
        "a switch that is no boolean": Case(
            ("task.chat_template=maybe",), r"task\.chat_template='maybe' is not true or false — "
        ),
        "vt too short": Case(("task.tasks=[vt]",), r"task\.lengths has 512, too short for vt: .* — use longer"),
        "an empty data file": Case(
            ("task=livecodebench", f"task.data_file={f['empty']}", "task.n=1"), rf"{f['empty']} is empty — ", base=MODEL
        ),
        "a data file that is not UTF-8": Case(
            ("task.tasks=[qa_1]", f"task.data_files.qa_1={f['latin1']}"),
            rf"{f['latin1']}:2: not UTF-8 text \(invalid continuation byte at byte 29\) — save it as UTF-8",
        ),
        "top_p": Case(("sampling.top_p=2",), r"sampling\.top_p=2 is outside \(0, 1\] — "),
        "top_k": Case(("sampling.top_k=x",), r"sampling\.top_k='x' is not an integer >= 0 — "),
        "malformed dataset line": Case(
            ("task.tasks=[qa_1]", f"task.data_files.qa_1={f['bad_jsonl']}"),
            rf"{f['bad_jsonl']}:2: not a JSON line .* — fix or delete that line",
        ),
        "missing dataset": Case(
            ("task=longbench", "task.datasets=[trec]", "task.n=1"),
            r"could not load zai-org/LongBench@.* — LongBench data: .*task\.data_dir",
            env=offline,
            base=MODEL,
        ),
        "missing checkpoint": Case(
            ("method=kvpop", f"method.checkpoint={f['file'].parent}/nope.safetensors"),
            r"nope\.safetensors.* does not exist — train one with .*harness\.training\.kvpop",
        ),
        "foreign checkpoint": Case(
            ("method=kvpop_mlp", f"method.checkpoint={f['foreign_ckpt']}"),
            r"trained for smollm2_135m .* — ",
        ),
        "not a checkpoint": Case(
            ("method=kvpop", f"method.checkpoint={f['text_ckpt']}"), r"is not a safetensors file .* — "
        ),
        "no kvpop metadata": Case(
            ("method=kvpop", f"method.checkpoint={f['plain_ckpt']}"), r"without KVpop metadata.* — "
        ),
        "unwritable results_dir": Case(
            (f"results_dir={f['file']}/sub",),
            r"cannot write .*a_file/sub.* — set results_dir to a folder you can write",
        ),
        "unwritable model cache": Case(
            (),
            r"cannot write to .*a_file/sub/models .* — set EVICTBENCH_CACHE",
            env=(("EVICTBENCH_CACHE", f"{f['file']}/sub"),),
        ),
        "prompt beyond the positions": Case(
            ("model.config.max_position_embeddings=256",),
            r"example niah_single_1/512/0000: \d+ prompt tokens \+ 128 new tokens exceed the model's 256 positions — ",
        ),
        "sliding-window layers": Case(
            ("model=tiny_mistral", "model.config.sliding_window=64"),
            r"model 'tiny_mistral' has sliding_attention layers .* — set model\.config\.sliding_window=null",
        ),
        "report: corrupt line": Case(
            (str(f["file"].parent / "corrupt"),),
            r"records\.jsonl:2: corrupt record .* — repair or delete line 2",
            module="harness.analysis.report",
        ),
        "report: duplicate line": Case(
            (str(f["file"].parent / "duplicate"),),
            r"lines 1 and 2 both record example_id='a' — ",
            module="harness.analysis.report",
        ),
        "report: no such folder": Case(
            ("does/not/exist",), r"does/not/exist is not a folder — ", module="harness.analysis.report"
        ),
        "tables: no such folder": Case(
            ("does/not/exist",), r"does/not/exist is not a folder — ", module="harness.analysis"
        ),
    }


def command(case: Case, results: Path) -> list[str]:
    args = list(case.args)
    if case.module == "harness.run":
        # The case's own overrides come last, so they win over the tiny defaults.
        args = [*case.base, f"results_dir={results}", *args]
    return [sys.executable, "-m", case.module, *args]


def run(case: Case, results: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EVICTBENCH_CACHE": str(cache), **dict(case.env)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(command(case, results), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[Case, subprocess.CompletedProcess, Path]]:
    base = tmp_path_factory.mktemp("mistakes")
    table = cases(files(base / "inputs"))
    # The model cache the tests share already holds the converted model: no case waits for it.
    cache = Path(os.environ.get("EVICTBENCH_CACHE", Path.home() / ".cache" / "evictbench"))
    folders = {name: base / f"results{i}" for i, name in enumerate(table)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, case, folders[name], cache) for name, case in table.items()}
    return {name: (table[name], future.result(), folders[name]) for name, future in futures.items()}


# The case names, from inputs that need not exist.
CASE_NAMES = list(
    cases(
        dict.fromkeys(("file", "bad_jsonl", "text_ckpt", "plain_ckpt", "foreign_ckpt", "empty", "latin1"), Path("/x/y"))
    )
)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_mistake_is_one_line_with_the_fix(name, outcomes):
    case, result, results = outcomes[name]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert len(errors) == 1, result.stderr[-2000:]
    assert " — " in errors[0]
    assert re.search(case.message, errors[0]), errors[0]
    # Refused before anything ran: no run folder (only Hydra's hidden log folder may exist).
    if results.exists():
        assert [p.name for p in results.iterdir() if not p.name.startswith(".")] == []


def test_an_empty_results_dir_writes_nothing_at_the_root():
    assert not Path("/.hydra").exists()


def test_hydra_full_error_shows_the_traceback_behind_the_line(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "harness.run", *TINY, "rho=1.5", f"results_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "rho=1.5 is outside [0, 1)" in result.stderr


def test_a_single_value_for_a_list_option_is_a_list():
    assert RulerTask(tasks="vt").tasks == ["vt"]
    assert RulerTask(tasks="vt", lengths=1024).lengths == [1024]


def test_report_reads_records_not_a_truncated_summary(tmp_path):
    folder = tmp_path / "tiny_llama__tova-6d526e4e__ruler-ae427061__rho0.5__seed0"
    folder.mkdir()
    record = {
        "example_id": "a",
        "subtask": "s",
        "metrics": {"score": 50.0},
        "prefill_len": 10,
        "new_tokens": 3,
        "kv_bytes_final": 5,
        "kv_bytes_full": 10,
        "decode_s": 1.0,
        "score_s": 0.1,
        "prefill_s": 0.1,
    }
    (folder / "records.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "summary.json").write_text('{"n": 1, "run_id": "tiny_ll')
    result = subprocess.run(
        [sys.executable, "-m", "harness.analysis.report", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "tiny_llama" in result.stdout and "50.0" in result.stdout
