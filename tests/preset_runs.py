"""Running ``conf/experiment`` presets' CPU forms on tiny models into one results root, as a user would.

Each sweep job of a preset (and of its ``also_run`` commands) is composed as ``python -m harness.run -m``
composes it and run in-process by ``harness.run.execute``, with tiny settings laid over the CPU form
(``tiny_settings``): random tiny models, one example per cell, short generations. What a CPU form
would read from the hub or from trained rows comes from the test: LongBench and LongBench-v2 files in
the hub schema, the math, GPQA and LiveCodeBench fixtures, KVpop's rows and the learned bilinear
scorer trained for a couple of steps on the tiny model. A job naming a method that is not in
``conf/method/`` yet is skipped, and only the cells of such a method's rows or columns may say "not
run".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from harness.analysis.papers import paper_tables
from harness.analysis.results import load_configs, load_results
from harness.analysis.spec import NOT_RUN
from harness.analysis.variants import LABELS, annotate
from harness.config import CONF_DIR, compose_config, experiment_preset
from harness.run import execute

FIXTURES = Path(__file__).parent / "fixtures"
#: The two CPU backbones side by side, as the InertiaKV CPU forms run theirs.
BACKBONES = "tiny_llama,tiny_qwen2"
#: KVpop's trained rows and the checkpoint geometry the tiny rows are trained with.
KVPOP_ROWS = ("streaming_llm_plus", "dms", "kvpop_mlp", "kvpop", "kvpop_immediate")
KVPOP_MODEL = "tiny_llama"


def tiny_settings(preset: str, short: bool, models: str = BACKBONES) -> list[str]:
    """Overrides that shrink a preset's CPU form to tiny models and one example per cell.

    ``models``: the InertiaKV CPU forms' backbones. ``short`` also puts every InertiaKV preset at one
    RULER length (512), the benchmarks' own: the efficiency preset then times the very examples a
    benchmark sweep decodes, the case its seed keeps apart.
    """
    if preset.startswith("inertia_"):
        settings = [
            f"forms.cpu.model='{models}'",
            "forms.cpu.ruler.tasks=[niah_single_1]",
            "forms.cpu.ruler.n=1",
            "inertia_longbench_tasks=[passage_retrieval_en]",
        ]
        return [*settings, "forms.cpu.ruler.lengths=[512]"] if short else settings
    if preset.startswith("fdkvc_"):
        # fdkvc_tables records more dialogs than the ablations, as the real forms do (600 against 200).
        return [f"forms.cpu.n_dialogs={3 if preset == 'fdkvc_tables' else 2}"]
    settings = [f"forms.cpu.models={KVPOP_MODEL}"]
    return settings + {
        "kvpop_table1": ["forms.cpu.task.n=1", "forms.cpu.task.samples=1", "forms.cpu.task.max_new_tokens=16"],
        "kvpop_table2": [
            "forms.cpu.gpqa.n=1",
            "forms.cpu.gpqa.gen_kwargs.max_gen_toks=16",
            "forms.cpu.livecodebench.n=1",
            "forms.cpu.livecodebench.max_new_tokens=16",
        ],
        # Fig. 4's limits include Table 1's 16: the same examples at the same limit, kept apart by its seed.
        "kvpop_fig4": ["forms.cpu.lengths='16,32'"],
        "kvpop_fig7": ["forms.cpu.max_new_tokens=16"],
    }.get(preset, [])


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


def jobs(preset: str, data: Path, short: bool = False, hub: bool = True, models: str = BACKBONES) -> list[list[str]]:
    """The preset's CPU sweep jobs (and those of its also_run commands); ``hub``: the hub benchmarks restored."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cluster = compose("config", overrides=[f"+experiment={preset}"])
        benchmarks = OmegaConf.select(cluster, "forms.cluster.benchmarks") if preset.startswith("inertia_") else None
        base = [f"+experiment={preset}", "scale=cpu", *tiny_settings(preset, short, models)]
        if benchmarks is not None and hub:
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
    return [[*base, *job, *task_data(job)] for job in runs]


def task_data(job: list[str]) -> list[str]:
    """Local copies of what a KVpop job's task reads from the hub (the fixtures in the hub schemas)."""
    chosen = {key.lstrip("+"): value for key, _, value in (override.partition("=") for override in job)}
    if chosen.get("task") in ("aime", "hmmt", "math500"):
        return [f"task.data_file={FIXTURES / 'math'}"]
    bench = chosen.get("experiment/kvpop/bench")
    if bench == "gpqa":
        return [f"task.data_files.gpqa_diamond_cot_zeroshot={FIXTURES / 'gpqa' / 'gpqa_diamond.csv'}"]
    if bench == "livecodebench":
        return [f"task.data_file={FIXTURES / 'livecodebench' / 'test6.jsonl'}"]
    return []


def hub_files(folder: Path) -> Path:
    """LongBench's passage_retrieval_en and LongBench-v2 in the hub schema, about 600 tokens each."""
    paragraphs = [f"Paragraph {i}: " + " ".join(f"river{i} stone{j} valley" for j in range(8)) for i in range(1, 31)]
    (folder / "longbench").mkdir(parents=True, exist_ok=True)
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
    (folder / "longbench_v2").mkdir(exist_ok=True)
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


def bilinear_checkpoint(folder: Path, model: str) -> Path:
    """A learned bilinear scorer for a tiny model, trained for a few steps (the presets' bilinear rows)."""
    from harness.training.bilinear.train import train

    output = folder / f"bilinear_{model}.safetensors"
    if output.is_file():
        return output
    overrides = [
        f"model={model}",
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


def train_kvpop_rows(root: Path) -> None:
    """Every trained row of KVpop's presets at both CPU budgets, where the presets look for them.

    A couple of steps on 128-token windows of the bundled text, with the geometry of
    ``tests/test_kvpop_training.py`` but StreamingLLM's 4 sinks (s = 4, w = 8), which StreamingLLM+ runs with.
    """
    from harness.training.kvpop.train import train

    budgets = experiment_preset("kvpop/forms.yaml")["forms"]["cpu"]["budgets"].values()
    for row in KVPOP_ROWS:
        for budget in budgets:
            output = root / "kvpop" / KVPOP_MODEL / f"{row}_B{budget}"
            if (output / "training.json").is_file():
                continue
            train(
                compose_config(
                    f"model={KVPOP_MODEL}", f"kvpop_recipe={row}", "kvpop.sinks=4", "kvpop.window=8",
                    f"kvpop.budget={budget}", "kvpop.cell_dim=4", "data.length=128", "data.skip=0", "data.windows=1",
                    "data.heldout=1", "train.steps=2", "train.eval_every=2", f"output={output}",
                    config_name="train_kvpop",
                )
            )  # fmt: skip


def _bilinear_model(job: list[str]) -> str | None:
    """The model of a job that runs the learned bilinear scorer (None: another method)."""
    if "method=bilinear" not in job and "+experiment/inertia/point=bilinear" not in job:
        return None
    return next(value for key, _, value in (o.partition("=") for o in reversed(job)) if key == "model")


def run_presets(
    presets: Sequence[str], root: Path, short: bool = False, hub: bool = True, models: str = BACKBONES
) -> set[str]:
    """Run every ready job of ``presets``, in order, into ``root``; returns the pending methods (jobs skipped)."""
    data = hub_files(root.parent / "hub")
    if any(preset.startswith("kvpop_") for preset in presets):
        train_kvpop_rows(root)
    pending: set[str] = set()
    for preset in presets:
        for job in jobs(preset, data, short, hub, models):
            missing = pending_method(job)
            if missing:
                pending.add(missing)
                continue
            model = _bilinear_model(job)
            if model is not None:
                job = [*job, f"method.scorer.checkpoint={bilinear_checkpoint(root.parent, model)}"]
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=[*job, f"results_dir={root}", "threads=1"])
            execute(cfg)
    return pending


def unfilled(tables: Path, keys: set[str], pending: set[str] = frozenset()) -> list[str]:
    """Cells saying "not run" outside the rows and columns of pending methods."""
    names = [LABELS.get(name, name) for name in pending] + list(pending)
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


def table_keys(presets: Sequence[str]) -> set[str]:
    """The tables the presets fill."""
    return {spec.key for spec in paper_tables() if spec.preset in presets}


def annotated(root: Path) -> pd.DataFrame:
    return annotate(load_results(root), load_configs(root))
