"""Every InertiaKV preset, in its CPU form on a tiny model, fills every cell of its tables and draws its figures.

Each sweep job of ``conf/experiment/inertia_*.yaml`` (and of its ``also_run`` commands) runs as
``python -m harness.run`` would run it, with ``model=tiny_llama``, one example per task, and
the hub benchmarks restored: the CPU form leaves LongBench and LongBench-v2 out because their
data comes from the hub, so here they read small files in the hub schema written by the test
(long enough for SnapKV's 32-entry window at 90%); the learned bilinear scorer's rows use a
checkpoint trained for two steps on the tiny model. A job naming a method that is not in
``conf/method/`` yet is skipped, and only the cells of such a method's rows or columns may say
"not run"; the list shrinks to nothing as the methods land.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from harness.analysis.figures import inertiakv as inertia_figures
from harness.analysis.figures import make_figures
from harness.analysis.papers import inertiakv as inertia_tables
from harness.analysis.papers import write_tables
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import NOT_RUN
from harness.analysis.variants import LABELS, annotate
from harness.config import CONF_DIR
from harness.run import execute

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("inertia_*.yaml"))
FAST = ("inertia_table4", "inertia_table14", "inertia_table13")
TINY = (
    "forms.cpu.model=tiny_llama",
    "forms.cpu.ruler.tasks=[niah_single_1]",
    "forms.cpu.ruler.n=1",
    "inertia_longbench_tasks=[passage_retrieval_en]",
)


def pending_method(job: list[str]) -> str | None:
    """The method a job names that has no ``conf/method`` config yet (directly or through an operating point)."""
    for override in job:
        key, _, value = override.lstrip("+").partition("=")
        if key == "method" and not (CONF_DIR / "method" / f"{value}.yaml").is_file():
            return value
        if key == "experiment/inertia/point":
            text = (CONF_DIR / "experiment" / "inertia" / "point" / f"{value}.yaml").read_text()
            named = re.search(r"override /method: (\w+)", text)
            if named and not (CONF_DIR / "method" / f"{named[1]}.yaml").is_file():
                return named[1]
    return None


def _sweep(params: dict[str, str]) -> list[list[str]]:
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return BasicSweeper.split_arguments(overrides, None)[0]


def jobs(preset: str, data: Path) -> list[list[str]]:
    """The preset's CPU sweep jobs (and those of its also_run commands), hub benchmarks restored."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cluster = compose("config", overrides=[f"+experiment={preset}"])
        benchmarks = OmegaConf.select(cluster, "forms.cluster.benchmarks")
        base = [f"+experiment={preset}", "scale=cpu", *TINY]
        if benchmarks is not None:
            base += [
                f"forms.cpu.benchmarks='{benchmarks}'",
                f"data_dirs.longbench={data / 'longbench'}",
                f"data_dirs.longbench_v2={data / 'longbench_v2'}",
            ]
        cfg = compose("config", overrides=base, return_hydra_config=True)
        params = {k: str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}
        runs = _sweep(params)
        for extra in cfg.get("also_run") or []:
            runs += _sweep({**params, **dict(item.split("=", 1) for item in extra.split())})
    return [[*base, *job] for job in runs]


def hub_files(folder: Path) -> Path:
    """LongBench's passage_retrieval_en and LongBench-v2 in the hub schema, about 600 tokens each."""
    paragraphs = [f"Paragraph {i}: " + " ".join(f"river{i} stone{j} valley" for j in range(8)) for i in range(1, 31)]
    (folder / "longbench").mkdir(parents=True)
    record = {
        "input": "A valley beside river 17.",
        "context": "\n\n".join(paragraphs),
        "answers": ["Paragraph 17"],
        "length": 600,
        "dataset": "passage_retrieval_en",
        "language": "en",
        "all_classes": None,
        "_id": "pr-long-0001",
    }
    (folder / "longbench" / "passage_retrieval_en.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "longbench_v2").mkdir()
    question = {
        "_id": "66f0000000000000000000aa",
        "domain": "Single-Document QA",
        "sub_domain": "Literary",
        "difficulty": "easy",
        "length": "short",
        "question": "Which paragraph names river 17?",
        "choice_A": "Paragraph 3",
        "choice_B": "Paragraph 17",
        "choice_C": "Paragraph 29",
        "choice_D": "None",
        "answer": "B",
        "context": "\n\n".join(paragraphs),
    }
    (folder / "longbench_v2" / "data.json").write_text(json.dumps([question]))
    return folder


def bilinear_checkpoint(folder: Path) -> Path:
    """A learned bilinear scorer for the tiny model, trained for a few steps (the presets' bilinear rows)."""
    from harness.training.bilinear.train import train

    output = folder / "bilinear.safetensors"
    overrides = [
        "model=tiny_llama",
        f"output={output}",
        f"results_dir={folder}",
        "data.length=64",
        "data.windows=2",
        "data.held_out=1",
        "data.skip=0",
        "train.steps=2",
        "train.log_every=1",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        train(compose("train_bilinear", overrides=overrides))
    return output


def uses_bilinear(job: list[str]) -> bool:
    return "method=bilinear" in job or "+experiment/inertia/point=bilinear" in job


def run_presets(presets: tuple[str, ...] | list[str], root: Path) -> set[str]:
    """Run every ready job of ``presets`` into ``root``; returns the pending methods whose jobs were skipped."""
    data = hub_files(root.parent / "hub")
    pending: set[str] = set()
    checkpoint = None
    for preset in presets:
        for job in jobs(preset, data):
            missing = pending_method(job)
            if missing:
                pending.add(missing)
                continue
            if uses_bilinear(job):
                checkpoint = checkpoint or bilinear_checkpoint(root.parent)
                job = [*job, f"method.scorer.checkpoint={checkpoint}"]
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=[*job, f"results_dir={root}", "threads=1"])
            execute(cfg)
    return pending


def unfilled(tables: Path, keys: set[str], pending: set[str]) -> list[str]:
    """Cells saying "not run" outside the rows and columns of pending methods."""
    names = [LABELS.get(name, name) for name in pending] + [name for name in pending]
    found = []
    for key in sorted(keys):
        lines = (tables / f"{key}.md").read_text().splitlines()
        header = [c.strip() for c in lines[2].strip("|").split("|")]
        for line in lines[4:]:
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            for column, cell in zip(header[1:], cells[1:], strict=True):
                if cell == NOT_RUN and not any(n in cells[0] or n in column for n in names):
                    found.append(f"{key}: {cells[0]} / {column}")
    return found


def _table_keys(presets: tuple[str, ...] | list[str]) -> set[str]:
    return {spec.key for spec in inertia_tables.tables() if spec.preset in presets}


def test_every_inertia_table_and_figure_has_a_preset() -> None:
    assert {spec.preset for spec in inertia_tables.tables()} <= set(PRESETS)
    for preset in PRESETS:
        text = (CONF_DIR / "experiment" / f"{preset}.yaml").read_text()
        assert "scale=cpu" in text and yaml.safe_load(text).get("hydra"), preset


def test_the_fast_presets_fill_every_cell(tmp_path: Path) -> None:
    root = tmp_path / "results"
    pending = run_presets(FAST, root)
    write_tables(root)
    assert unfilled(root / "tables", _table_keys(FAST), pending) == []
    assert inertia_figures.lazy_quality(annotated(root), root, tmp_path) != []


@pytest.mark.slow
def test_every_inertia_cpu_preset_fills_every_cell_and_draws_every_figure(tmp_path: Path) -> None:
    root = tmp_path / "results"
    pending = run_presets(PRESETS, root)
    write_tables(root)
    assert unfilled(root / "tables", _table_keys(PRESETS), pending) == []
    frame, out = annotated(root), tmp_path / "figures"
    out.mkdir()
    for name, figure in inertia_figures.FIGURES.items():
        assert figure(frame, root, out), f"{name}: not drawn"
    assert make_figures(root)


def annotated(root: Path):
    return annotate(load_results(root), load_configs(root))
