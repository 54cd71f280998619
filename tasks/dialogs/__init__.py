"""The FD-KVC paper's synthetic dialog world (``task=dialogs``)."""

from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.task import DialogTask
from tasks.dialogs.world import BENCHMARK, SCENARIOS, SCHEDULES, Scenario, WorldConfig

__all__ = ["BENCHMARK", "SCENARIOS", "SCHEDULES", "CachePolicy", "DialogTask", "Scenario", "WorldConfig"]
