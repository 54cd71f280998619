"""Time the FD-KVC paper's benchmark in the dialog world: the whole benchmark and the per-turn update.

    python scripts/dialog_bench.py                 # 5 scenarios x 600 dialogs, the paper's four methods
    python scripts/dialog_bench.py --n 100 --single 20

Prints, per method, the seconds the five scenarios take with every scenario's dialogs run side
by side (as ``python -m harness.run`` runs them), and the seconds inside the method per turn
for one dialog run alone (the latency column of Table 4), beside the paper's 0.027 ms (FIFO)
and 0.105 ms (FD-KVC): its NumPy implementation on one Apple M-series core, under 60 s for
the benchmark. Runs on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra.utils import instantiate

from harness.config import compose_config
from harness.protocols.dialog_world import MethodPolicy
from tasks.dialogs import BENCHMARK, DialogTask

METHODS = ("fifo", "sink_window", "h2o", "fdkvc")
PAPER_MS_PER_TURN = {"fifo": 0.027, "fdkvc": 0.105}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=600, help="dialogs per scenario")
    parser.add_argument("--single", type=int, default=50, help="dialogs timed alone for the per-turn latency")
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = DialogTask(n_dialogs=args.n, scenarios=list(BENCHMARK))
    print(f"{len(BENCHMARK)} scenarios x {args.n} dialogs, one thread")
    print(f"{'method':<12} {'benchmark s':>12} {'ms/turn alone':>14} {'paper ms/turn':>14}")
    total = 0.0
    for name in METHODS:
        policy = MethodPolicy(instantiate(compose_config(f"method={name}", "rho=0").method))
        started = time.perf_counter()
        task.evaluate(policy)
        seconds = time.perf_counter() - started
        total += seconds
        latencies = []
        for scenario in BENCHMARK:
            for index in range(args.single // len(BENCHMARK) or 1):
                trace = task.simulate(policy, task.dialogs(scenario, [index]))
                latencies.append(1e3 * trace.method_s / trace.alignment.shape[1])
        paper = PAPER_MS_PER_TURN.get(name)
        print(
            f"{name:<12} {seconds:>12.1f} {statistics.median(latencies):>14.3f} "
            f"{'-' if paper is None else f'{paper:.3f}':>14}"
        )
    print(f"{'all four':<12} {total:>12.1f}   (paper: under 60 s)")


if __name__ == "__main__":
    main()
