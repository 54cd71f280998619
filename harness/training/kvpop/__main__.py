"""``python -m harness.training.kvpop model=<model> kvpop.sinks=4 kvpop.window=32 kvpop.k=96``: train a KVpop scorer.

The config is ``conf/train_kvpop.yaml``; the checkpoint is written to ``output`` with its model,
geometry and training config, ready for ``method=kvpop method.checkpoint=<path>``.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from harness.errors import cli
from harness.training.kvpop.train import train


@hydra.main(config_path="../../../conf", config_name="train_kvpop", version_base="1.3")
def main(cfg: DictConfig) -> None:
    summary = train(cfg)
    print(json.dumps({"checkpoint": summary["checkpoint"], "final": summary["history"][-1]}))


if __name__ == "__main__":
    cli(main)
