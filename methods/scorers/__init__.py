"""Per-step importance signals; pick one with ``method/scorer=<name>``."""
