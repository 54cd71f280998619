"""Evaluate KVpop checkpoints: retention recall vs the teacher, and perplexity under eviction vs heuristics.

    python scripts/kvpop_eval.py --checkpoint results/kvpop/smollm2_135m/kvpop_B96/policy.safetensors

1. Retention recall (KVpop's Table: top-k recall vs the teacher): on held-out windows of the
   training corpus (after ``--skip`` windows, beyond the training windows), at query positions
   sampled after saturation, the share of the teacher's top-k (future-attention target with the
   scorer's decay) that the policy's top-k keeps; per layer and KV head, and for the recency
   ranking (StreamingLLM's choice) as reference. Reported at the trained ``k`` and at the ``k``
   of each compression ratio for a ``--length`` context.
2. Quality: ``task=ppl`` (teacher-forced windows of the bundled text, the method evicting at
   every step) through ``harness.run.execute`` for ``full``, the heuristics and every checkpoint
   at each ``--rhos`` value; records go to ``--results-dir`` (reruns resume).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from harness.config import compose_config, model_spec
from harness.models import ModelSpec, load_model, load_tokenizer
from harness.run import execute
from harness.training.kvpop.data import documents, token_windows
from harness.training.kvpop.loss import sample_queries
from harness.training.kvpop.train import extract
from methods.kvpop import load_checkpoint
from methods.kvpop.ranking import candidates, decayed, retention_recall


def checkpoint_name(checkpoint: str) -> str:
    """A checkpoint's name in the output: training writes every row's as ``<row>_B<B>/policy.safetensors``."""
    path = Path(checkpoint)
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def recall_table(
    checkpoint: str, spec: ModelSpec, length: int, windows: int, skip: int, queries: int, rhos: list[float]
) -> dict[str, Any]:
    """Recall of the policy and of recency vs the teacher, overall and per layer x head."""
    scorer, info = load_checkpoint(checkpoint)
    s, w, k_trained, n = (info.policy[key] for key in ("sinks", "window", "k", "bucket"))
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    texts = documents(None, None)
    generator = torch.Generator().manual_seed(0)
    ks = {"trained": k_trained} | {f"rho={rho}": math.floor((1 - rho) * length + 1e-9) - s - w for rho in rhos}
    sums: dict[str, dict[str, torch.Tensor]] = {name: {} for name in ks}
    for ids in token_windows(tokenizer, texts, length, windows, skip):
        window = extract(model, ids, w, 1e-6, "auto")
        with torch.no_grad():
            scores = scorer(window.keys, window.values)
            log_gamma = scorer.log_gamma()
        for name, k in ks.items():
            picked = sample_queries(length, s + w + k, queries, 0.5, generator)
            teacher = decayed(window.target, picked, log_gamma, n)
            mask = candidates(picked, length, s, w).expand_as(teacher)
            rankings = {
                "kvpop": decayed(scores, picked, log_gamma, n),
                "recency": torch.arange(length, dtype=teacher.dtype).expand_as(teacher),
            }
            for label, ranking in rankings.items():
                recall = retention_recall(ranking, teacher, mask, k).mean(-1)  # (layers, heads)
                sums[name][label] = sums[name].get(label, 0) + recall / windows
    return {
        name: {"k": ks[name]}
        | {label: round(float(value.mean()), 4) for label, value in by_label.items()}
        | {"kvpop_per_layer_head": [[round(float(x), 3) for x in row] for row in by_label["kvpop"]]}
        for name, by_label in sums.items()
    }


def perplexities(kvpop: list[tuple[str, str]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Perplexity (exp of the mean NLL) of the full cache, the baselines and every checkpoint at each rho."""
    rows = []
    task = [f"task.prefill={args.length}", f"task.eval_tokens={args.eval_tokens}", f"task.n={args.ppl_windows}"]
    methods: list[tuple[str, str | None]] = [("full", None), *((name, None) for name in args.baselines), *kvpop]
    for method, checkpoint in methods:
        for rho in [0.0] if method == "full" else args.rhos:
            overrides = [f"model={args.model}", f"method={method}", "task=ppl", *task, f"rho={rho}"]
            overrides += [f"threads={args.threads}", f"results_dir={args.results_dir}"]
            if checkpoint is not None:
                overrides.append(f"method.checkpoint={checkpoint}")
                base = load_checkpoint(checkpoint)[1].base_model
                if base is not None:  # a jointly trained policy runs on the weights fine-tuned with it
                    overrides += ["model.source=hub", f"model.path={base}"]
            summary = execute(compose_config(*overrides))
            label = method if checkpoint is None else f"{method}:{checkpoint_name(checkpoint)}"
            nll = summary["subtasks"]["ppl"]["nll"]
            rows.append({"method": label, "rho": rho, "ppl": round(math.exp(nll), 3), "nll": round(nll, 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", nargs="+", required=True, help="KVpop checkpoints (.safetensors)")
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--length", type=int, default=1024, help="context length (recall windows, ppl prefill)")
    parser.add_argument("--windows", type=int, default=3, help="held-out windows for recall")
    parser.add_argument("--skip", type=int, default=120, help="windows skipped before the held-out ones")
    parser.add_argument("--queries", type=int, default=32, help="query positions per window for recall")
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.75, 0.88])
    parser.add_argument("--baselines", nargs="+", default=["streaming_llm", "tova", "inertia"])
    parser.add_argument("--eval-tokens", type=int, default=128, help="teacher-forced tokens per ppl window")
    parser.add_argument("--ppl-windows", type=int, default=2)
    parser.add_argument("--no-ppl", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = model_spec(args.model)
    report: dict[str, Any] = {"recall": {}}
    kvpop_methods = []
    for checkpoint in args.checkpoint:
        kind = load_checkpoint(checkpoint)[0].kind
        kvpop_methods.append(("kvpop" if kind == "mlstm" else "kvpop_mlp", checkpoint))
        recall = recall_table(checkpoint, spec, args.length, args.windows, args.skip, args.queries, args.rhos)
        report["recall"][checkpoint] = recall
        for name, row in recall.items():
            print(f"recall {checkpoint_name(checkpoint)} {name} k={row['k']}: kvpop {row['kvpop']:.3f} "
                  f"recency {row['recency']:.3f}")  # fmt: skip
    if not args.no_ppl:
        report["ppl"] = perplexities(kvpop_methods, args)
        print("| method | rho | ppl |\n|---|---|---|")
        for row in report["ppl"]:
            print(f"| {row['method']} | {row['rho']} | {row['ppl']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
