"""The FD-KVC paper's Tables 1-6 in the synthetic dialog world, beside the paper's figures.

    python scripts/dialog_tables.py                      # 600 dialogs per scenario, all methods
    python scripts/dialog_tables.py --n 100 --ablation-n 50
    python scripts/dialog_tables.py --noise-var 0.0025   # read N(0, 0.05 I) as std 0.05

Every method is the object ``conf/method/<name>.yaml`` instantiates (``rho=0``; the task
sets the world's budget of 56). Runs on one CPU thread by default, as the paper's timing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import pandas as pd
import torch
from hydra.utils import instantiate
from scipy.stats import ttest_rel

from harness.config import compose_config
from harness.world import MethodPolicy
from tasks.dialogs import SCENARIOS, DialogTask

METHODS = ("fifo", "sink_window", "h2o", "fdkvc", "tova", "inertia", "cumulative")
LABELS = {
    "fifo": "FIFO",
    "sink_window": "Sink(4)+Window",
    "h2o": "H2O",
    "fdkvc": "FD-KVC",
    "tova": "TOVA",
    "inertia": "InertiaKV",
    "cumulative": "Cumulative",
}
#: FD-KVC's relative alignment change over H2O reported by the paper (Table 1).
PAPER_FD_OVER_H2O = {"topic_shift": 1.27, "gradual": 0.87, "mixed": 0.30, "topic_return": -0.64 / 1.64}
PAPER_COMPOSITE = 0.067
PAPER_ADAPTATION = {"fdkvc": "4.5", "h2o": "16 (never)"}
PAPER_DIVERSITY = {"fdkvc": 80.6, "sink_window": 73.3, "h2o": 70.0, "fifo": 47.6}
PAPER_RETENTION = {"fifo": 91.4, "fdkvc": 70.1, "h2o": 63.3}


def conf_method(name: str, *overrides: str) -> MethodPolicy:
    """``conf/method/<name>.yaml`` as the dialog world's cache policy."""
    return MethodPolicy(instantiate(compose_config(f"method={name}", "rho=0", *overrides).method))


def fmt(value: float, digits: int = 3) -> str:
    return "-" if pd.isna(value) else f"{value:.{digits}f}"


def markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def run_all(task: DialogTask, methods: dict[str, MethodPolicy], n: int) -> tuple[pd.DataFrame, dict]:
    frames, seconds = [], {name: 0.0 for name in methods}
    for scenario in task.scenarios:  # scenario outer: the task reuses the drawn dialogs
        for name, method in methods.items():
            start = time.perf_counter()
            frame = task.evaluate(method, [scenario], n=n)
            seconds[name] += time.perf_counter() - start
            frames.append(frame.assign(method=name))
    return pd.concat(frames, ignore_index=True), seconds


def table1(results: pd.DataFrame, names: list[str]) -> str:
    means = results.groupby(["method", "scenario"])["alignment"].mean().unstack()
    scenarios = list(SCENARIOS)
    rows = []
    for name in names:
        row = {"method": LABELS.get(name, name)}
        row.update({s: fmt(means.loc[name, s]) for s in scenarios})
        row["composite"] = fmt(means.loc[name, scenarios].mean())
        rows.append(row)
    out = [markdown(pd.DataFrame(rows))]
    if "fdkvc" in means.index and "h2o" in means.index:
        fd, h2o = means.loc["fdkvc"], means.loc["h2o"]
        rel = {s: (fd[s] - h2o[s]) / h2o[s] for s in scenarios}
        composite = (fd[scenarios].mean() - h2o[scenarios].mean()) / h2o[scenarios].mean()
        rows = [
            {
                "scenario": s,
                "ours FD-KVC vs H2O": f"{100 * rel[s]:+.1f}%",
                "paper": f"{100 * PAPER_FD_OVER_H2O[s]:+.1f}%" if s in PAPER_FD_OVER_H2O else "n/a",
            }
            for s in scenarios
        ]
        rows.append({"scenario": "composite", "ours FD-KVC vs H2O": f"{100 * composite:+.1f}%", "paper": "+6.7%"})
        out.append(markdown(pd.DataFrame(rows)))
        out.append("(paper: H2O +64% over FD-KVC on topic return, i.e. FD-KVC -39.0% vs H2O)")
    return "\n\n".join(out)


def per_method(results: pd.DataFrame, names: list[str], columns: dict[str, Callable]) -> str:
    rows = []
    for name in names:
        part = results[results.method == name]
        rows.append({"method": LABELS.get(name, name), **{k: f(part, name) for k, f in columns.items()}})
    return markdown(pd.DataFrame(rows))


def adaptation_cell(part: pd.DataFrame, scenario: str) -> str:
    chosen = part[part.scenario == scenario]
    return f"{chosen.adaptation.mean():.2f} ({100 * chosen.adaptation_never.mean():.0f}%)"


def first_shift_complex(task: DialogTask, policy: MethodPolicy, n: int) -> float:
    """Adaptation after the first shift of the complex scenario (turn 5 of 20): never -> 16."""
    from tasks.dialogs.simulate import adaptation, simulate

    dialogs = task.dialogs("complex", list(range(n)))
    trace = simulate(policy, dialogs, task.heads, task.budget, task.retention_threshold, task.seed)
    speed, _ = adaptation(trace.retention, [SCENARIOS["complex"].shifts()[0]], task.adaptation_threshold)
    return float(speed.mean())


def ablation(task: DialogTask, n: int, name: str, values: list[float], paired: Callable) -> str:
    rows = []
    for value in values:
        method = conf_method("fdkvc", *paired(value))
        frame = task.evaluate(method, ["mixed"], n=n)
        rows.append({name: value, "alignment (mixed)": fmt(frame.alignment.mean(), 4)})
    best = max(rows, key=lambda r: float(r["alignment (mixed)"]))
    return markdown(pd.DataFrame(rows)) + f"\n\npeak at {name}={best[name]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=600, help="dialogs per scenario")
    parser.add_argument("--ablation-n", type=int, default=200, help="dialogs of Mixed in Tables 5-6")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-var", type=float, default=0.05)
    parser.add_argument("--tied-qk", action="store_true", help="W_K = W_Q")
    parser.add_argument("--weight-std", type=float, default=None, help="std of W entries (default 1/8)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fdkvc", nargs="*", default=[], help="extra overrides for fdkvc, e.g. method.beta=0")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.methods.split(",")
    task = DialogTask(
        n_dialogs=args.n,
        seed=args.seed,
        noise_var=args.noise_var,
        tied_qk=args.tied_qk,
        weight_std=args.weight_std,
    )
    methods = {name: conf_method(name, *(args.fdkvc if name == "fdkvc" else [])) for name in names}

    start = time.perf_counter()
    results, seconds = run_all(task, methods, args.n)
    wall = time.perf_counter() - start
    world = f"noise_var={args.noise_var}, tied_qk={args.tied_qk}, weight_std={args.weight_std}"
    print(f"# Dialog world: {world}, seed={args.seed}, n={args.n}\n")
    print(f"Benchmark: {len(task.scenarios)} scenarios x {args.n} dialogs x {len(names)} methods in {wall:.1f} s ")
    print(f"({args.threads} thread(s)); per method: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    paper4 = [m for m in ("fifo", "sink_window", "h2o", "fdkvc") if m in seconds]
    print(f"The paper's four methods: {sum(seconds[m] for m in paper4):.1f} s\n")

    print("## Table 1: late-turn alignment\n")
    print(table1(results, names) + "\n")

    print("## Table 2: adaptation speed (turns to 80% retention after a shift; never = remaining turns)\n")
    shifting = [s for s in SCENARIOS if SCENARIOS[s].shifts()]
    columns = {s: (lambda part, _n, s=s: adaptation_cell(part, s)) for s in shifting}
    columns["mean"] = lambda part, _n: f"{part.adaptation.mean():.2f}"
    columns["complex 1st shift"] = lambda part, n: f"{first_shift_complex(task, methods[n], args.n):.2f}"
    columns["paper"] = lambda part, n: PAPER_ADAPTATION.get(n, "")
    print(per_method(results, names, columns))
    print("\ncells: mean turns (share of shifts never adapted)\n")

    print("## Table 3: late diversity (% of the dialog's topics with >= 1 cached token)\n")
    columns = {s: (lambda part, _n, s=s: f"{100 * part[part.scenario == s].diversity.mean():.1f}") for s in SCENARIOS}
    columns["mean"] = lambda part, _n: f"{100 * part.diversity.mean():.1f}"
    columns["paper"] = lambda part, n: PAPER_DIVERSITY.get(n, "")
    print(per_method(results, names, columns) + "\n")

    print("## Table 4: late retention (% of cache on the current topic, cos > 0.3) and latency\n")
    columns = {s: (lambda part, _n, s=s: f"{100 * part[part.scenario == s].retention.mean():.1f}") for s in SCENARIOS}
    columns["mean"] = lambda part, _n: f"{100 * part.retention.mean():.1f}"
    columns["paper"] = lambda part, n: PAPER_RETENTION.get(n, "")
    columns["latency us/turn"] = lambda part, _n: f"{1e3 * part.latency_ms_per_turn.mean():.1f}"
    print(per_method(results, names, columns) + "\n")

    if "fdkvc" in names and "h2o" in names:
        print("## Paired t-tests, FD-KVC vs H2O (late alignment, same dialogs)\n")
        rows = []
        for scenario in SCENARIOS:
            part = results[results.scenario == scenario]
            fd = part[part.method == "fdkvc"].sort_values("index").alignment.to_numpy()
            h2o = part[part.method == "h2o"].sort_values("index").alignment.to_numpy()
            test = ttest_rel(fd, h2o)
            rows.append(
                {
                    "scenario": scenario,
                    "FD-KVC": fmt(fd.mean()),
                    "H2O": fmt(h2o.mean()),
                    "diff": f"{fd.mean() - h2o.mean():+.3f}",
                    "t": f"{test.statistic:.2f}",
                    "p": f"{test.pvalue:.1e}" if test.pvalue > 0 else "<1e-300",
                }
            )
        print(markdown(pd.DataFrame(rows)) + "\n")

    overrides = list(args.fdkvc)
    print(f"## Table 5: w_c ablation (w_recency = 1 - w_c), Mixed, {args.ablation_n} dialogs (paper: peak at 0.3)\n")
    print(
        ablation(
            task,
            args.ablation_n,
            "w_c",
            [0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0],
            lambda v: [*overrides, f"method.w_c={v}", f"method.w_recency={round(1 - v, 6)}"],
        )
        + "\n"
    )
    print(f"## Table 6: gamma ablation, Mixed, {args.ablation_n} dialogs (paper: peak at 0.80)\n")
    print(
        ablation(
            task,
            args.ablation_n,
            "gamma",
            [0.6, 0.7, 0.75, 0.8, 0.85, 0.88, 0.9, 0.95],
            lambda v: [*overrides, f"method.gamma={v}"],
        )
    )


if __name__ == "__main__":
    main()
