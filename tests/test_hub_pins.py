"""Every hub dataset a task reads by default is pinned to a commit, so a rerun reads the same data."""

from __future__ import annotations

import re

from hydra.utils import instantiate

from harness.config import compose_config
from tasks.longbench.task import LongBenchTask
from tasks.longbench_v2.task import LongBenchV2Task
from tasks.math.sources import SOURCES as MATH_SOURCES
from tasks.ruler.qa import SOURCES as QA_SOURCES

COMMIT = re.compile(r"[0-9a-f]{40}")


def test_default_revisions_are_commits() -> None:
    revisions = {
        **{f"ruler/{name}": source.revision for name, source in QA_SOURCES.items()},
        **{f"math/{name}": source.revision for name, source in MATH_SOURCES.items()},
        "longbench": LongBenchTask().revision,
        "longbench_v2": LongBenchV2Task().revision,
    }
    assert len(revisions) == 8
    for name, revision in revisions.items():
        assert COMMIT.fullmatch(revision), f"{name} reads {revision!r}, not a pinned commit"


def test_configs_keep_the_pins() -> None:
    for task, field in (("longbench", "revision"), ("longbench_v2", "revision")):
        configured = instantiate(compose_config(f"task={task}").task)
        assert COMMIT.fullmatch(getattr(configured, field))
    ruler = instantiate(compose_config("task=ruler").task)
    assert all(value is None for value in ruler.revisions.values())
    aime = instantiate(compose_config("task=aime").task)
    assert all(COMMIT.fullmatch(aime.source(name).revision) for name in aime.competitions)
    gpqa = instantiate(compose_config("task=gpqa_diamond").task)
    assert COMMIT.fullmatch(gpqa.revisions["gpqa_diamond_cot_zeroshot"])
