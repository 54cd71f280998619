"""The FD-KVC paper's synthetic dialog world (``task=dialogs``)."""

from tasks.dialogs.policy import CachePolicy
from tasks.dialogs.task import DialogTask
from tasks.dialogs.world import SCENARIOS, Scenario, WorldConfig

__all__ = ["SCENARIOS", "CachePolicy", "DialogTask", "Scenario", "WorldConfig"]
