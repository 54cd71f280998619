"""``python -m harness.training.bilinear model=<model>``: train InertiaKV's bilinear scorer.

The config is ``conf/train_bilinear.yaml``; the head is written to ``output`` with its model and
geometry, ready for ``method=bilinear`` (``method.scorer.checkpoint=<path>`` picks another).
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from harness.errors import cli
from harness.training.bilinear.train import train


@hydra.main(config_path="../../../conf", config_name="train_bilinear", version_base="1.3")
def main(cfg: DictConfig) -> None:
    summary = train(cfg)
    print(json.dumps({key: summary[key] for key in ("checkpoint", "final", "held_out")}))


if __name__ == "__main__":
    cli(main)
