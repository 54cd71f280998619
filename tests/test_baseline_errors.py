"""The InertiaKV baselines' inapplicable options as real commands: one line with the fix, exit code 2, no run folder."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_user_errors import Case, run

from methods.scorers.bilinear import BilinearHead, BilinearInfo, save_bilinear


def cases(folder: Path) -> dict[str, Case]:
    foreign = folder / "smollm2_head.safetensors"
    save_bilinear(
        BilinearHead(1, 9 * 64, 3 * 64, 8), str(foreign), BilinearInfo("smollm2_135m", 30, 9, 3, 64, 8, False)
    )
    return {
        "per-head budget at token granularity": Case(
            ("method=adakv_ea", "method.selection.granularity=token"),
            r"method\.selection\.granularity='token' does not suit adakv_ea, .*"
            r" — use method\.selection\.granularity=head",
        ),
        "unknown KVzip mode": Case(
            ("method=kvzip", "method.mode=masked"), r"method\.mode='masked' is not a KVzip mode — "
        ),
        "unknown schedule": Case(("method=keydiff", "method.schedule=always"), r"method\.schedule='always' .* — use "),
        "ragged rescoring without a ragged scorer": Case(
            ("method=keydiff", "method.allocation=adaptive", "method.schedule=decode"),
            r"KeyDiffScorer cannot score — use method\.schedule=prefill",
        ),
        "bilinear checkpoint of another model": Case(
            ("method=bilinear", f"method.scorer.checkpoint={foreign}"),
            r"trained for smollm2_135m .* model='tiny_llama' — train one with python -m harness\.training\.bilinear"
            r" model=tiny_llama",
        ),
        "missing bilinear checkpoint": Case(
            ("method=bilinear", f"method.scorer.checkpoint={folder}/none.safetensors"),
            r"bilinear checkpoint .*none\.safetensors' does not exist — train one with",
        ),
        "bilinear training without query rows": Case(
            ("model=tiny_llama", "data.length=64", "train.min_position=64", f"results_dir={folder}/training"),
            r"train\.min_position=64 leaves no query row .* — lower it",
            module="harness.training.bilinear",
        ),
    }


CASE_NAMES = [
    "per-head budget at token granularity",
    "unknown KVzip mode",
    "unknown schedule",
    "ragged rescoring without a ragged scorer",
    "bilinear checkpoint of another model",
    "missing bilinear checkpoint",
    "bilinear training without query rows",
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("baseline_mistakes")
    table = cases(base)
    assert sorted(table) == sorted(CASE_NAMES)
    cache = Path(os.environ.get("EVICTBENCH_CACHE", Path.home() / ".cache" / "evictbench"))
    folders = {name: base / f"results{i}" for i, name in enumerate(table)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, case, folders[name], cache) for name, case in table.items()}
    return {name: (table[name], future.result(), folders[name]) for name, future in futures.items()}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_an_inapplicable_option_is_one_line_with_the_fix(name, outcomes):
    case, result, results = outcomes[name]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert len(errors) == 1 and " — " in errors[0], result.stderr[-2000:]
    assert re.search(case.message, errors[0]), errors[0]
    if results.exists():
        assert [p.name for p in results.iterdir() if not p.name.startswith(".")] == []
