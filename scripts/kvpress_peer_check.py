"""Peer check against kvpress: the prompt entries our prefill-time baselines keep, head by head.

    python scripts/kvpress_peer_check.py --kvpress kvpress-venv/bin/python --rhos 0.5 0.9 --n 6

For each method and its kvpress press (``PEERS``), on RULER prompts built with SmolLM2's
tokenizer (``--subtasks`` x ``--lengths``, ``--n`` each), both sides prefill the same token ids
under the same compression ratio and report, per layer and KV head, the prompt positions kept
after the prefill, then decode greedily. kvpress runs in its own environment
(``scripts/kvpress_prefill.py`` says how to make one) on the same weights, saved as a transformers
folder under ``--out``, where kvpress's rows are kept for reruns.

Prints a Markdown table per method and ratio (prompts our preset refuses, a budget below its
protected window, are left out and counted): (example, layer, KV head) keep sets equal, the
mean Jaccard of those that differ, greedy answers equal, and RULER's string_match_all of both.
A press's defaults that differ from our preset are set on our side (``PEERS``), so the table
compares one algorithm, not two parameter choices. So is kvpress's budget: it keeps
``int(L0 * (1 - rho))`` entries, which float rounding makes one fewer than the paper's
``floor((1 - rho) * L0)`` whenever that product is a whole number (L0 = 890 at rho = 0.9: 88, not
89); on those prompts our side runs with ``method.selection.budget_tokens`` set to kvpress's count,
and the table says on how many prompts that was.

KVzip is compared under two of its readings (``methods/kvzip.py``), each against the form of
``KVzipPress`` it reads: ``kvzip`` with ``method.context=after_template`` and kvpress's count
against the press handed the whole prompt (it reconstructs everything after the chat template's
opening), and ``kvzip_mask`` (kvpress's pipeline reading, the preset's) against the press run as
kvpress's pipeline runs it: the prompt up to the template's closing is prefilled under the
press, the closing and the answer prefix join afterwards. Both count kvpress's entries
themselves (``method.pool=kvpress``), so no budget is set for them; their keep sets are read in
the evict mode (the mask mode makes the same choice and leaves every entry in the cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate

from harness.config import compose_config, model_spec
from harness.decode.engine import Engine, Request
from harness.models import load_model, load_tokenizer
from tasks.ruler.task import RulerTask

SCRIPT = Path(__file__).resolve().with_name("kvpress_prefill.py")


@dataclass(frozen=True)
class Peer:
    """One of our presets beside one kvpress press (a name in ``kvpress_prefill.PRESSES``).

    ``overrides`` give our preset the press's defaults (or the reading compared); ``counts_kvpress``:
    our side counts kvpress's entries itself, so its budget is not set per prompt.
    """

    preset: str
    press: str
    overrides: tuple[str, ...] = ()
    counts_kvpress: bool = False


PEERS: dict[str, Peer] = {
    "adakv_ea": Peer("adakv_ea", "AdaKVPress(ExpectedAttentionPress)"),
    "keydiff": Peer("keydiff", "KeyDiffPress"),
    "tova": Peer("tova", "TOVAPress"),
    "snapkv": Peer(
        "snapkv", "SnapKVPress", ("method.pooling=avg", "method.kernel_size=5", "method.selection.window=64")
    ),
    "kvzip": Peer("kvzip", "KVzipPress", ("+method.context=after_template", "+method.pool=kvpress"), True),
    "kvzip_mask": Peer("kvzip_mask", "KVzipPress(pipeline)", ("method.mode=evict",), True),
}


def prompt_keeps(positions: list[Any], prefill_len: int) -> list[list[list[int]]]:
    """Per layer and KV head, the sorted prompt positions among a driver's cached ``positions``."""
    out = []
    for layer in positions:
        rows = layer if isinstance(layer, tuple) else tuple(layer.unbind(0))
        out.append([sorted(p for p in row.tolist() if p < prefill_len) for row in rows])
    return out


def agreement(ours: list[list[list[int]]], theirs: list[list[list[int]]]) -> tuple[int, int, list[float]]:
    """(heads equal, heads compared, Jaccard of each head that differs) between two keep sets."""
    equal, total, jaccards = 0, 0, []
    for our_layer, their_layer in zip(ours, theirs, strict=True):
        for mine, ref in zip(our_layer, their_layer, strict=True):
            total += 1
            if mine == ref:
                equal += 1
            else:
                a, b = set(mine), set(ref)
                jaccards.append(len(a & b) / len(a | b))
    return equal, total, jaccards


def kvpress_budget(prefill_len: int, rho: float) -> int:
    """The entries kvpress keeps per head (its ``compute_n_kept``): a truncated float product."""
    return max(1, int(prefill_len * (1 - rho)))


def ours(model: Any, tokenizer: Any, peer: Peer, rho: float, ids: list[int], new_tokens: int) -> dict[str, Any]:
    """Our keep sets after the prefill and greedy tokens for one prompt, at kvpress's budget."""
    overrides = (f"method={peer.preset}", f"rho={rho}", *peer.overrides)
    cfg = compose_config(*overrides)
    budget = kvpress_budget(len(ids), rho)
    matched = not peer.counts_kvpress and budget != instantiate(cfg.method.selection).budget_for(len(ids))
    if matched:
        cfg = compose_config(*overrides, f"method.selection.budget_tokens={budget}")
    engine = Engine(model, instantiate(cfg.method), tokenizer=tokenizer)
    captured: dict[str, Any] = {}

    def after_prefill(step: int, state: Any, cache: Any) -> None:
        if step == 0:
            captured["kept"] = prompt_keeps(state.driver.positions, len(ids))

    engine.on_step = after_prefill
    generation = engine.generate(Request(ids, new_tokens, stop_token_ids={tokenizer.eos_token_id}))
    return {"kept": captured["kept"], "tokens": generation.tokens, "matched": matched}


def table_row(model: Any, tokenizer: Any, task: RulerTask, peer: Peer, rho: float, rows: list, new_tokens: int) -> str:
    """One peer and ratio over ``rows`` of (example, kvpress's row): the Markdown line."""
    equal = total = same = matched = 0
    jaccards: list[float] = []
    scores = {"ours": 0.0, "kvpress": 0.0}
    refused: list[str] = []
    for example, ref in rows:
        try:
            mine = ours(model, tokenizer, peer, rho, example.input_ids, new_tokens)
        except ValueError as error:
            # Our preset refuses a budget below its protected window (kvpress would cut into the window).
            refused.append(str(error))
            continue
        e, t, j = agreement(mine["kept"], ref["kept"])
        equal, total, jaccards = equal + e, total + t, jaccards + j
        same += mine["tokens"] == ref["tokens"]
        matched += mine["matched"]
        for side, tokens in (("ours", mine["tokens"]), ("kvpress", ref["tokens"])):
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            scores[side] += task.score(text, example)["string_match_all"]
    compared = len(rows) - len(refused)
    scores = {side: value / max(compared, 1) for side, value in scores.items()}
    mean_j = f"{sum(jaccards) / len(jaccards):.3f}" if jaccards else "-"
    label = " ".join((peer.preset, *peer.overrides))
    cells = [label, peer.press, rho, f"{compared}/{len(rows)}", f"{matched}/{compared}", f"{equal}/{total}",
             mean_j, f"{same}/{compared}", f"{scores['ours']:.2f}", f"{scores['kvpress']:.2f}"]  # fmt: skip
    line = "| " + " | ".join(map(str, cells)) + " |"
    return line + (f"\n\n(not compared: {len(refused)} prompts, e.g. {refused[0]})\n" if refused else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvpress", required=True, help="python of an environment with kvpress")
    parser.add_argument("--methods", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.5, 0.9])
    parser.add_argument("--subtasks", nargs="+", default=["niah_single_1", "niah_multikey_1"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--n", type=int, default=6, help="examples per subtask and length")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/kvpress_peer"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = model_spec("smollm2_135m")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    folder = args.out / "model"
    if not (folder / "config.json").is_file():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    task = RulerTask(tasks=args.subtasks, lengths=args.lengths, n=args.n)
    examples = {example.example_id: example for example in task.examples(tokenizer)}
    request = {
        "model": str(folder),
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "presses": [{"press": PEERS[m].press, "rho": rho} for m in args.methods for rho in args.rhos],
        "examples": [{"id": key, "ids": example.input_ids} for key, example in examples.items()],
    }
    # kvpress's side takes most of the time; a rerun with the same request reads its rows back.
    text = json.dumps(request, sort_keys=True)
    saved = args.out / f"kvpress_{hashlib.sha256(text.encode()).hexdigest()[:12]}.jsonl"
    if not saved.is_file():
        done = subprocess.run([args.kvpress, str(SCRIPT)], input=text, capture_output=True, text=True, check=True)
        saved.write_text(done.stdout)
    theirs = {(row["press"], row["rho"], row["id"]): row for row in map(json.loads, saved.read_text().splitlines())}
    versions = next(iter(theirs.values()))
    print(f"kvpress {versions['kvpress']} (transformers {versions['transformers']}), {len(examples)} prompts\n")
    print("| method | kvpress press | rho | prompts compared | budget set to kvpress's | heads equal |"
          " Jaccard where not | answers equal | ours | kvpress |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        for rho in args.rhos:
            rows = [(example, theirs[(PEERS[method].press, rho, key)]) for key, example in examples.items()]
            print(table_row(model, tokenizer, task, PEERS[method], rho, rows, args.new_tokens), flush=True)


if __name__ == "__main__":
    main()
