"""What the analysis reads from the experiment presets (``conf/experiment``): which runs are a preset's.

A table or figure reads the runs of the preset that fills it, not every run that happens to match its
model, method and length. Two things mark them, both set in the preset's YAML and nowhere else:

- its **seed**: a run's seed is part of its run id, so a preset whose numbers are timings
  (``inertia_efficiency``, ``kvpop_fig4``) runs under a seed of its own (``seed:`` in the preset) and
  gets run folders of its own. A benchmark sweep that decoded the same examples first can then never
  lend it its timings (they were measured while other jobs shared the machine, or at another
  length's settings), and its timed examples never enter a benchmark table. Greedy decoding ignores
  the seed, so the timed runs decode exactly what the benchmark runs decode;
- its **forms**: the RULER lengths (``forms.<scale>.ruler.lengths``) its sweeps use, at both scales,
  where those alone tell its runs apart (Figure 6 at 64k, the benchmark columns at 4k and 16k).

Presets without a ``seed:`` run under the config's default (``conf/config.yaml``), which every
benchmark table reads.
"""

from __future__ import annotations

from functools import cache

import yaml

from harness.config import CONF_DIR, experiment_preset


@cache
def default_seed() -> int:
    """The seed of a run that sets none (``conf/config.yaml``)."""
    return int(yaml.safe_load((CONF_DIR / "config.yaml").read_text())["seed"])


@cache
def preset_seed(preset: str) -> int:
    """The seed ``conf/experiment/<preset>.yaml`` runs under: its own ``seed:``, else the config's default."""
    seed = experiment_preset(f"{preset}.yaml").get("seed")
    return default_seed() if seed is None else int(seed)


def preset_lengths(path: str) -> list[int]:
    """RULER lengths of a preset's forms, both scales (``forms.<scale>.ruler.lengths``; ``path`` under
    ``conf/experiment``)."""
    forms = experiment_preset(path).get("forms") or {}
    rulers = [(form.get("ruler") or {}) for form in forms.values() if isinstance(form, dict)]
    return sorted({int(n) for ruler in rulers for n in ruler.get("lengths", [])})
