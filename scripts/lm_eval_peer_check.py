"""Peer check against lm-eval's own RULER: lm-eval's hf model, evictbench through lm-eval, and ``task=ruler``.

    python scripts/lm_eval_peer_check.py --n 50 --lengths 1024 2048 --threads 1

On SmolLM2-135M-Instruct with a full cache, for lm-eval's offline synthetic RULER tasks
(niah_multikey_2/3, ruler_vt, ruler_cwe, ruler_fwe), each subtask and length on its own:

1. ``hf``: lm-eval's own hf model on the converted checkpoint (float32, CPU);
2. ``evictbench``: the evictbench lm-eval model with ``method=full`` on the same documents;
   the two must agree exactly: the same prompt for every document and the same greedy output;
3. ``task=lm_eval``: the same documents built by ``harness.run``'s lm-eval task (prompts
   compared with 1.; its outputs are 2.'s code path);
4. ``task=ruler``: the harness's own RULER synthesis with the same subtasks and lengths, raw
   prompt (``task.chat_template=false``, as lm-eval's default), greedy, full cache.

Prints a Markdown table: scores x100 (lm-eval's string_match_all of each document at its
length), whether 1. and 2. agree (documents with equal prompts / equal outputs), and the
difference of 4. to 1. with a 95% CI (unpaired bootstrap: the two syntheses draw different
documents). Everything is cached under ``--out`` (lm-eval's per-document samples as JSON,
task=ruler's records), so a rerun only computes what is missing.

Each of 1.-3. runs in a process of its own (``--only``): lm-eval's ruler_fwe and ruler_cwe draw
their documents from Python's global ``random``, so in one process every build after the first
gets other documents, and the ways would not see the same ones.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import harness.lm_eval_model  # noqa: F401  (registers the evictbench lm-eval model)
from harness.config import compose_config, model_spec
from harness.models import load_tokenizer
from harness.run import execute
from tasks.lm_eval.task import LmEvalTask

SUBTASKS = {  # lm-eval's name -> the harness's task=ruler name
    "niah_multikey_2": "niah_multikey_2",
    "niah_multikey_3": "niah_multikey_3",
    "ruler_vt": "vt",
    "ruler_cwe": "cwe",
    "ruler_fwe": "fwe",
}


def lm_eval_samples(way: str, subtask: str, length: int, n: int, out: Path, models: dict[str, Any]) -> list[dict]:
    """Per document of ``subtask`` at ``length``: prompt hash, raw output, score; lm-eval with ``way``'s model."""
    path = out / way / f"{subtask}_{length}_n{n}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import lm_eval

    results = lm_eval.simple_evaluate(
        model=models[way](),
        tasks=[subtask],
        limit=n,
        metadata={"max_seq_lengths": [length], "tokenizer": models["tokenizer"]},
        log_samples=True,
        bootstrap_iters=0,
    )
    samples = [
        {
            "doc_id": sample["doc_id"],
            "prompt_hash": sample["prompt_hash"],
            "output": sample["resps"][0][0],
            "score": float(sample[str(length)]),
        }
        for sample in results["samples"][subtask]
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(samples, indent=1))
    return samples


def harness_prompts(subtask: str, length: int, n: int, out: Path, tokenizer: Any) -> list[dict]:
    """The prompt hashes ``task=lm_eval`` builds for the same documents, by document id."""
    path = out / "task_lm_eval" / f"{subtask}_{length}_n{n}.json"
    if path.is_file():
        return json.loads(path.read_text())
    from lm_eval.utils import hash_string

    task = LmEvalTask(tasks=[subtask], n=n, metadata={"max_seq_lengths": [length]})
    examples = task.examples(tokenizer)
    documents = task._documents
    samples = [
        {
            "doc_id": example.meta["doc_id"],
            "prompt_hash": hash_string(documents[example.example_id].requests[0].arguments[0]),
        }
        for example in examples
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(samples, indent=1))
    return samples


def in_own_process(way: str, subtask: str, length: int, args: argparse.Namespace) -> list[dict]:
    """``way``'s samples of ``subtask`` at ``length``, computed by a fresh process if not cached yet."""
    path = args.out / way / f"{subtask}_{length}_n{args.n}.json"
    if not path.is_file():
        only = ["--only", way, subtask, str(length), "--n", str(args.n), "--threads", str(args.threads)]
        subprocess.run([sys.executable, __file__, *only, "--out", str(args.out)], check=True)
    return json.loads(path.read_text())


def ruler_scores(subtask: str, length: int, n: int, out: Path, threads: int) -> list[float]:
    """``task=ruler`` scores (0-1) of ``subtask`` (the harness's name) at ``length``, from its records under ``out``."""
    overrides = [
        "model=smollm2_135m",
        "method=full",
        "rho=0",
        f"threads={threads}",
        f"results_dir={out / 'ruler'}",
        "task=ruler",
        f"task.tasks=[{subtask}]",
        f"task.lengths=[{length}]",
        f"task.n={n}",
        "task.chat_template=false",
    ]
    summary = execute(compose_config(*overrides))
    # One run id holds every subtask and length (they select examples, not what an example is).
    lines = (out / "ruler" / summary["run_id"] / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [
        next(iter(record["metrics"].values())) / 100
        for record in records
        if record["subtask"] == subtask and record["meta"]["length"] == length
    ]


def difference_ci(a: list[float], b: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """mean(b) - mean(a) and its 95% unpaired bootstrap interval."""
    rng = random.Random(seed)
    diffs = sorted(
        statistics.fmean(rng.choices(b, k=len(b))) - statistics.fmean(rng.choices(a, k=len(a)))
        for _ in range(resamples)
    )
    return statistics.fmean(b) - statistics.fmean(a), diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="documents per subtask and length")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--subtasks", nargs="+", default=list(SUBTASKS), choices=list(SUBTASKS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/lm_eval_peer"))
    parser.add_argument("--only", nargs=3, metavar=("WAY", "SUBTASK", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    spec = model_spec("smollm2_135m")
    tokenizer = load_tokenizer(spec)
    folder = tokenizer.name_or_path
    built: dict[str, Any] = {}

    def once(way: str, make: Any) -> Any:
        return lambda: built[way] if way in built else built.setdefault(way, make())

    def hf() -> Any:
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=folder, dtype="float32", device="cpu", batch_size=1)

    def evictbench() -> Any:
        return harness.lm_eval_model.EvictbenchLM(model="smollm2_135m", method="full", rho=0, threads=args.threads)

    models = {"hf": once("hf", hf), "evictbench": once("evictbench", evictbench), "tokenizer": folder}
    if args.only:
        way, subtask, length = args.only
        if way == "task_lm_eval":
            harness_prompts(subtask, int(length), args.n, args.out, tokenizer)
        else:
            lm_eval_samples(way, subtask, int(length), args.n, args.out, models)
        return
    print(
        "| subtask | length | n | lm-eval hf | evictbench (lm-eval, full) | prompts equal | outputs equal "
        "| task=lm_eval prompts equal | task=ruler | task=ruler - hf [95% CI] |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for subtask in args.subtasks:
        for length in args.lengths:
            reference = in_own_process("hf", subtask, length, args)
            ours = in_own_process("evictbench", subtask, length, args)
            by_doc = {sample["doc_id"]: sample for sample in ours}
            prompts = sum(by_doc[s["doc_id"]]["prompt_hash"] == s["prompt_hash"] for s in reference)
            outputs = sum(by_doc[s["doc_id"]]["output"] == s["output"] for s in reference)
            rebuilt = {s["doc_id"]: s["prompt_hash"] for s in in_own_process("task_lm_eval", subtask, length, args)}
            harness_equal = sum(rebuilt.get(s["doc_id"]) == s["prompt_hash"] for s in reference)
            hf_scores = [s["score"] for s in reference]
            ruler = ruler_scores(SUBTASKS[subtask], length, args.n, args.out, args.threads)
            diff, low, high = difference_ci(hf_scores, ruler)
            print(
                f"| {subtask} | {length} | {len(reference)} | {100 * statistics.fmean(hf_scores):.1f}"
                f" | {100 * statistics.fmean(s['score'] for s in ours):.1f} | {prompts}/{len(reference)}"
                f" | {outputs}/{len(reference)} | {harness_equal}/{len(reference)}"
                f" | {100 * statistics.fmean(ruler):.1f}"
                f" | {100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] |",
                flush=True,
            )


if __name__ == "__main__":
    main()
