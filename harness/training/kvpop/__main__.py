"""``python -m harness.training.kvpop kvpop_recipe=<row> kvpop.budget=<B>``: train a row of KVpop's tables.

The config is ``conf/train_kvpop.yaml`` (rows: ``conf/kvpop_recipe/``, scales: ``conf/kvpop_scale/``);
the row's folder ``output`` holds the fine-tuned base model and the policy checkpoint, with the
model, geometry and training config they were made with.
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
    print(json.dumps({"output": summary["output"], "k": summary["k"], "final": summary["history"][-1]}))


if __name__ == "__main__":
    cli(main)
