"""Temporal rules that fold per-step scores into a state; pick one with ``method/aggregator=<name>``."""
