"""``python -m harness.bench``: decode speed, KV size and scoring share, side by side.

For each prompt length L0 and compression rho, every method decodes the same number of
tokens after the same prompt (a RULER niah_single_1 prompt synthesised at L0), plus the
full cache on a prompt of B tokens: the physical limit any eviction method at budget B can
approach. Figures are printed, not asserted: run it on a quiet machine.

    python -m harness.bench --lengths 4096 8192 --rhos 0.9 --new-tokens 64

With ``--batch-sizes 1 8`` it then decodes N = the largest size of such prompts (RULER's first N
niah_single_1 examples at L0) at each batch size and prints the decode throughput: tokens of all
sequences per second of decode wall time (prefills excluded), and its ratio to batch 1.

With ``--ops`` it prints what a GPU's decode step costs, counted on any device
(``harness.decode.counting``): per method and batch size, the kernels and host syncs of a
steady-state step (after eviction has started; the mean of ``OPS_STEPS`` steps, so Lazy-4's observing
step weighs one in four), on a random model of Llama-3.1-8B's geometry in bf16 and fp32 (32 layers, 32
query and 8 KV heads of 128; the widths that only size the products are cut, which changes no count),
and whether the step compiles as one graph that never recompiles (``compiled``: the CPU's proxy of
CUDA-graph capture; ``eager`` where the method has no static steady state, or at batch > 1).

``--numerics 1 2 3 4`` runs every table under each of the engine's numerics (``harness.decode.engine.NUMERICS``;
full and full@B, the single-sequence table's references, under 1). By default each table takes what a run's
``numerics=auto`` takes where it counts: the model's device for the timed tables (1 on a CPU), and a GPU for
``--ops`` (4), whose counts stand for a GPU's step.

With ``--kvpress <python of an environment with kvpress>`` (kvpress pins its own transformers:
``scripts/kvpress_decode.py`` says how to make one) it also runs kvpress's decode-time press,
``DecodingPress(KnormPress)`` compressing to B every step and every 16 steps, on the same prompt,
and prints its decode speed beside transformers' full cache in that environment and beside ours
for ``full`` and the key-norm score at every step (``single_step:method/scorer=keynorm`` with per
KV head selection, as kvpress selects). A method may carry overrides after a colon:
``--methods single_step:method/scorer=keynorm,method.selection.granularity=head``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from hydra.utils import instantiate

from harness.config import compose_config, model_spec, resolve_numerics
from harness.decode.counting import counting
from harness.decode.engine import Engine, Request
from harness.errors import cli
from harness.models import ModelSpec, load_model, load_tokenizer, resolve_device
from methods.base import EvictionMethod
from methods.full import FullCache
from methods.selection import exact_floor
from tasks.ruler.task import RulerTask


@dataclass
class BenchRow:
    length: int
    rho: float
    method: str
    numerics: int
    context: int
    budget: int | None
    decode_tok_s: float
    prefill_s: float
    kv_mb: float
    slot_mb: float
    peak_mb: float
    kv_ratio: float
    score_share: float
    evict_share: float
    prefill_score_share: float


def measure(
    engine: Engine, ids: list[int], new_tokens: int, label: str, rho: float, length: int, profile: bool = False
) -> BenchRow:
    """One generation timed as a run times it (unprofiled: the steady steps run as in a run). With
    ``profile``, the method's and the gathers' shares of a step come from a second, profiled
    generation of the same request (every step eager, the method timed apart); else they are NaN."""
    result = engine.generate(Request(ids, new_tokens))
    shares = result
    if profile:
        shares = replace(engine, profile=True).generate(Request(ids, new_tokens))
    steps = result.new_tokens - 1
    return BenchRow(
        length=length,
        rho=rho,
        method=label,
        numerics=engine.numerics,
        context=len(ids),
        budget=result.budget,
        decode_tok_s=steps / result.decode_s,
        prefill_s=result.prefill_s,
        kv_mb=result.kv_bytes_final / 2**20,
        slot_mb=result.slot_bytes_final / 2**20,
        peak_mb=result.decode_peak_bytes / 2**20,
        kv_ratio=result.kv_bytes_final / result.kv_bytes_full,
        score_share=_share(shares.score_s, shares.decode_s),
        evict_share=_share(shares.evict_s, shares.decode_s),
        prefill_score_share=result.prefill_score_s / result.prefill_s,
    )


def _share(part: float | None, whole: float) -> float:
    return math.nan if part is None else part / whole


DEFAULT_METHODS = ["full", "tova", "h2o", "inertia", "inertia_lazy", "score_free"]
KVPRESS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kvpress_decode.py"
KEYNORM_DECODE = "single_step:method/scorer=keynorm,method.selection.granularity=head"


def bench_method(spec: str, rho: float) -> EvictionMethod:
    """The method ``spec`` names: a preset, optionally followed by ``:override,override``."""
    name, _, extra = spec.partition(":")
    return instantiate(compose_config(f"method={name}", f"rho={rho}", *filter(None, extra.split(","))).method)


def run(
    model_name: str,
    lengths: list[int],
    rhos: list[float],
    methods: list[str],
    new_tokens: int,
    repeats: int = 1,
    profile: bool = False,
    numerics: Sequence[int] = (1,),
) -> pd.DataFrame:
    """One row per length, rho, method and ``numerics``: the median over ``repeats`` rounds, each round running
    every method once in turn (interleaved, so a slow spell of a shared machine hits them all).
    ``profile``: also the score and evict shares of a step, from a profiled generation (``measure``).
    The references, full and full@B, run under the reference numerics (1): their step is SDPA's under any."""
    spec = model_spec(model_name)
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    rows: list[BenchRow] = []
    for length in lengths:
        ids = RulerTask(tasks=["niah_single_1"], lengths=[length], n=1).examples(tokenizer)[0].input_ids
        for rho in rhos:
            for _ in range(repeats):
                for name in methods:
                    for number in (1,) if name == "full" else numerics:
                        engine = Engine(model, bench_method(name, rho), tokenizer=tokenizer, numerics=number)
                        rows.append(measure(engine, ids, new_tokens, name, rho, length, profile))
                        print(rows[-1], flush=True)
                budget = exact_floor((1 - rho) * len(ids))
                rows.append(measure(Engine(model, FullCache()), ids[-budget:], new_tokens, "full@B", rho, length))
                print(rows[-1], flush=True)
    runs = pd.DataFrame([asdict(r) for r in rows])
    table = runs.groupby(["length", "rho", "method", "numerics"], sort=False).median(numeric_only=True).reset_index()
    keys = list(zip(table.length, table.rho, strict=True))
    for reference in ("full", "full@B"):
        if reference not in set(table.method):
            continue
        speed = table[table.method == reference].set_index(["length", "rho"]).decode_tok_s
        table[f"x_{reference}"] = [s / speed[k] for s, k in zip(table.decode_tok_s, keys, strict=True)]
    if "full" in set(table.method):
        prefill = table[table.method == "full"].set_index(["length", "rho"]).prefill_s
        table["prefill_x_full"] = [s / prefill[k] for s, k in zip(table.prefill_s, keys, strict=True)]
    return table


def batch_run(
    model_name: str,
    lengths: list[int],
    rhos: list[float],
    methods: list[str],
    new_tokens: int,
    sizes: list[int],
    numerics: Sequence[int] = (1,),
) -> pd.DataFrame:
    """Decode throughput of the same N prompts at each batch size (N = the largest size), under each ``numerics``.

    Every sequence decodes exactly ``new_tokens`` (no stop token), so sequences that start together
    end together and the decode wall time of a batch is any member's ``decode_s``: the throughput
    at batch b is b * (all decode steps) / (sum of the sequences' ``decode_s``).
    """
    spec = model_spec(model_name)
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    count = max(sizes)
    rows = []
    for length in lengths:
        examples = RulerTask(tasks=["niah_single_1"], lengths=[length], n=count).examples(tokenizer)
        requests = [Request(example.input_ids, new_tokens) for example in examples]
        for rho in rhos:
            for name, number in itertools.product(methods, numerics):
                engine = Engine(model, bench_method(name, rho), tokenizer=tokenizer, numerics=number)
                for size in sizes:
                    done = [generation for _, generation in engine.generate_batch(enumerate(requests), size)]
                    steps = sum(generation.new_tokens - 1 for generation in done)
                    seconds = sum(generation.decode_s for generation in done) / size
                    rows.append({"length": length, "rho": rho, "method": name, "numerics": number, "batch_size": size,
                                 "sequences": len(done), "decode_tok_s": steps / seconds})  # fmt: skip
                    print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    keys = ["length", "rho", "method", "numerics"]
    alone = table[table.batch_size == min(sizes)].set_index(keys).decode_tok_s
    table[f"x_batch{min(sizes)}"] = [
        speed / alone[key]
        for speed, key in zip(table.decode_tok_s, table[keys].itertuples(index=False, name=None), strict=True)
    ]
    return table


def kvpress_run(python: str, model_name: str, lengths: list[int], rhos: list[float], new_tokens: int) -> pd.DataFrame:
    """kvpress's decode-time press in its own environment (``python``) beside ours, on the same prompts."""
    spec = model_spec(model_name)
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    rows = []
    for length in lengths:
        ids = RulerTask(tasks=["niah_single_1"], lengths=[length], n=1).examples(tokenizer)[0].input_ids
        for rho in rhos:
            budget = exact_floor((1 - rho) * len(ids))
            for name, label in (("full", "full"), (KEYNORM_DECODE, "keynorm per head, every step")):
                row = measure(Engine(model, bench_method(name, rho)), ids, new_tokens, name, rho, length)
                rows.append({"length": length, "rho": rho, "budget": row.budget, "method": f"evictbench {label}",
                             "decode_tok_s": row.decode_tok_s, "cache_len_final": None})  # fmt: skip
                print(rows[-1], flush=True)
            request = {"model": tokenizer.name_or_path, "ids": ids, "budget": budget, "new_tokens": new_tokens,
                       "threads": torch.get_num_threads(), "intervals": [1, 16]}  # fmt: skip
            done = subprocess.run(
                [python, str(KVPRESS_SCRIPT)], input=json.dumps(request), capture_output=True, text=True, check=True
            )
            for line in done.stdout.splitlines():
                theirs = json.loads(line)
                fields = {key: theirs[key] for key in ("method", "decode_tok_s", "cache_len_final")}
                rows.append({"length": length, "rho": rho, "budget": budget, **fields})
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    for reference in ("evictbench full", "kvpress full"):
        speed = table[table.method == reference].set_index(["length", "rho"]).decode_tok_s
        table[f"x_{reference.replace(' ', '_')}"] = [
            s / speed[k] for s, k in zip(table.decode_tok_s, zip(table.length, table.rho, strict=True), strict=True)
        ]
    return table


#: The steps ``--ops`` averages over (after the prompt's eviction and the first decode steps).
OPS_STEPS = (9, 10, 11, 12)
OPS_METHODS = ("full", "inertia", "inertia_lazy", "score_free", "tova_decode", "h2o", "adakv_ea")
#: Llama-3.1-8B's geometry with the widths that only size the products cut: the same op graph, small enough
#: for any CPU in either dtype.
OPS_GEOMETRY = ("model=random_llama31_8b", "model.config.hidden_size=256", "model.config.intermediate_size=512",
                "model.config.vocab_size=2048")  # fmt: skip


def _steady_counts(engine: Engine, requests: list[Request], batch: int) -> tuple[float, float]:
    """Mean kernels and host syncs per step over ``OPS_STEPS``."""
    counted: list = []

    def around(step: int) -> contextlib.AbstractContextManager:
        if step not in OPS_STEPS:
            return contextlib.nullcontext()
        return _Recorded(counted)

    engine.around_step = around
    list(engine.generate_batch(enumerate(requests), batch)) if batch > 1 else engine.generate(requests[0])
    engine.around_step = None
    return (
        sum(c.kernel_count for c in counted) / len(counted),
        sum(c.sync_count for c in counted) / len(counted),
    )


class _Recorded(contextlib.AbstractContextManager):
    def __init__(self, into: list) -> None:
        self.into = into

    def __enter__(self) -> None:
        self.context = counting()
        self.into.append(self.context.__enter__())

    def __exit__(self, *exc: object) -> None:
        self.context.__exit__(*exc)


def _compiled(model: Any, method: EvictionMethod, requests: list[Request], numerics: int) -> str:
    """Whether the steady step (a batch's: ``SteadyRows``) compiles as one graph per path with no recompilation over
    64 steps after warm-up."""
    torch._dynamo.reset()
    compiles: list[int] = []
    engine = Engine(model, method, steady="compiled", token_lag=4, numerics=numerics)
    engine.around_step = lambda step: _CountCompiles(compiles, step)
    try:
        list(engine.generate_batch(enumerate(Request(request.input_ids, 80) for request in requests), len(requests)))
    except torch._dynamo.exc.Unsupported as error:
        return f"graph break ({str(error).splitlines()[0][:60]})"
    if not any(compiles):
        return "eager (no static steady state)" if len(requests) == 1 else "eager"
    late = sum(compiles[16:])
    return "clean" if late == 0 else f"{late} recompilations after warm-up"


class _CountCompiles(contextlib.AbstractContextManager):
    def __init__(self, into: list[int], step: int) -> None:
        self.into, self.step = into, step

    def __enter__(self) -> None:
        self.before = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def __exit__(self, *exc: object) -> None:
        self.into.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - self.before)


def ops_table(
    methods: list[str], dtypes: list[str], batch_sizes: list[int], numerics: Sequence[int], length: int = 512
) -> str:
    """The ``--ops`` table in Markdown, one block of rows per dtype and ``numerics`` (``Engine.numerics``)."""
    lines = [
        "| dtype | numerics | method | batch | kernels/step | x full | syncs/step | compiled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dtype in dtypes:
        spec = ModelSpec.from_config(compose_config(*OPS_GEOMETRY, f"model.dtype={dtype}", "model.device=cpu").model)
        model = load_model(spec)
        prompts = [[(7 * i + j) % 2000 + 1 for j in range(length)] for i in range(max(batch_sizes))]
        for number in numerics:
            full: dict[int, float] = {}
            for name in methods:
                for batch in batch_sizes:
                    requests = [Request(ids, max(OPS_STEPS) + 2) for ids in prompts[:batch]]
                    engine = Engine(model, bench_method(name, 0.5), token_lag=4, steady="eager", numerics=number)
                    kernels, syncs = _steady_counts(engine, requests, batch)
                    if name == "full":
                        full[batch] = kernels
                    ratio = f"{kernels / full[batch]:.2f}" if batch in full else ""
                    compiled = _compiled(model, bench_method(name, 0.5), requests, number)
                    cells = (dtype, number, name, batch, f"{kernels:.0f}", ratio, f"{syncs:.2f}", compiled)
                    lines.append(f"| {' | '.join(map(str, cells))} |")
                    print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.9])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all methods; medians are printed")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="also decode throughput at these")
    parser.add_argument("--skip-single", action="store_true", help="only the batch or kvpress table")
    parser.add_argument("--kvpress", default=None, help="python of an environment with kvpress: compare with it")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled generation of the shares")
    parser.add_argument("--ops", action="store_true", help="count kernels and host syncs per steady step instead")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], help="--ops: the model's dtypes")
    parser.add_argument(
        "--numerics", type=int, nargs="+", default=None,
        help="the engine's numerics (1-4): every table runs under each (default: what numerics=auto takes there)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    if args.ops:
        methods = args.methods if args.methods != DEFAULT_METHODS else list(OPS_METHODS)
        numerics = args.numerics or [resolve_numerics("auto", torch.device("cuda"))]
        print(ops_table(methods, args.dtypes, args.batch_sizes or [1, 8], numerics))
        return
    args.numerics = args.numerics or [resolve_numerics("auto", resolve_device(model_spec(args.model).device))]
    header = f"\nmodel={args.model} new_tokens={args.new_tokens} threads={torch.get_num_threads()}"
    if not args.skip_single:
        table = run(
            args.model, args.lengths, args.rhos, args.methods, args.new_tokens, args.repeats, not args.no_profile,
            args.numerics,
        )  # fmt: skip
        print(f"{header} repeats={args.repeats}")
        print(table.round(3).to_string(index=False))
    if args.batch_sizes:
        table = batch_run(
            args.model, args.lengths, args.rhos, args.methods, args.new_tokens, args.batch_sizes, args.numerics
        )
        print(f"{header} batch sizes={args.batch_sizes}")
        print(table.round(3).to_string(index=False))
    if args.kvpress:
        table = kvpress_run(args.kvpress, args.model, args.lengths, args.rhos, args.new_tokens)
        print(f"{header} against kvpress ({args.kvpress})")
        print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    cli(main)
