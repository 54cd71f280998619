"""The FD-KVC paper's synthetic dialog world (``task=dialogs``)."""

from tasks.dialogs.task import DialogTask, for_world
from tasks.dialogs.world import SCENARIOS, Scenario, WorldConfig

__all__ = ["SCENARIOS", "DialogTask", "Scenario", "WorldConfig", "for_world"]
