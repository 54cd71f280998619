"""The decode engine's acceptance checks on one GPU (``scripts/gpu_check.sh`` runs them after the tests).

Every check runs, whatever an earlier one gave, and prints PASS, FAIL or INFO with its figure; the
summary at the end lists them. On Llama-3.1-8B's geometry with random weights (no hub):

- ``sync-free``: the steady steps of every decode-time method run under
  ``torch.cuda.set_sync_debug_mode("error")`` (a host sync inside a step raises), and batch 8's steps of
  full, SnapKV and InertiaKV;
- ``kernels``: the profiler's kernel launches per steady step, per method (AdaKV+EA's padded heads too), and
  batch 8's against batch 1's (target <= 1.5x);
- ``bf16-fp32``: the Jaccard of the final kept sets in bf16 against fp32 (random weights, so near-ties
  are many: a figure to watch, not a verdict);
- ``speed``: decode tokens/s at the longest length, median of ``--repeats`` after a warm-up, as a
  ratio to the full cache cut to B (target: inertia >= 0.9x), with the prefill's and decode's
  peak memory; the prefill-scoring and ragged methods (h2o, tova_decode, adakv_ea, kvzip) must
  finish at that length.

Every engine runs with ``numerics`` 4 (``--numerics``), the step a GPU run takes by default (``numerics=auto``),
even in the CPU smoke form.

Off a GPU (``--device cpu --length 512``) the same code runs on a small geometry: a smoke test of
the script, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import traceback
from collections.abc import Callable
from typing import Any

import torch

from harness.bench import bench_method
from harness.config import compose_config
from harness.decode import engine as engine_module
from harness.decode.engine import Engine, Request
from harness.models import ModelSpec, load_model, load_tokenizer
from methods.full import FullCache
from methods.overlap import jaccard

DECODE_METHODS = ("inertia", "inertia_lazy", "score_free", "tova_decode", "h2o")
LONG_METHODS = ("h2o", "tova_decode", "adakv_ea", "kvzip")
# Off a GPU: narrow widths, and a vocabulary that still holds SmolLM2's token ids (KVzip's passes use its tokenizer).
SMALL = ("model.config.hidden_size=256", "model.config.intermediate_size=512", "model.config.vocab_size=49152")
RHO = 0.9
#: What every engine here is built with (``--numerics``): 4, the step a GPU run takes (``numerics=auto``), by default.
ENGINE: dict[str, Any] = {"numerics": 4}
results: list[tuple[str, str, str]] = []


def check(name: str, run: Callable[[], tuple[bool | None, str]]) -> None:
    """Run one check; record PASS/FAIL (INFO where it has no threshold), or FAIL with the error."""
    try:
        verdict, figure = run()
        status = "INFO" if verdict is None else ("PASS" if verdict else "FAIL")
    except Exception as error:  # noqa: BLE001 - a check that breaks is a failure, and the next one runs
        traceback.print_exc()
        status, figure = "FAIL", f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
    results.append((status, name, figure))
    print(f"{status:4} {name}: {figure}", flush=True)


def spec(args: argparse.Namespace, dtype: str) -> ModelSpec:
    small = SMALL if args.device == "cpu" else ()
    overrides = ("model=random_llama31_8b", *small, f"model.dtype={dtype}", f"model.device={args.device}")
    return ModelSpec.from_config(compose_config(*overrides).model)


def model(args: argparse.Namespace, dtype: str) -> Any:
    return load_model(spec(args, dtype))


def prompt(length: int, vocab: int) -> list[int]:
    return torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()


class _SyncsAreErrors(contextlib.AbstractContextManager):
    def __enter__(self) -> None:
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_sync_debug_mode("default")


def sync_free(lm: Any, ids: list[int], name: str, device: str) -> tuple[bool | None, str]:
    engine = Engine(lm, bench_method(name, RHO), **ENGINE)
    if device == "cuda":
        # Steps from the 8th on: the cache is at its budget and the graphs are captured by then.
        engine.around_step = lambda step: _SyncsAreErrors() if step >= 8 else contextlib.nullcontext()
    generation = engine.generate(Request(ids, 48))
    return (True if device == "cuda" else None), f"{generation.new_tokens} tokens, steps 8+ under sync debug mode"


def sync_free_batch(lm: Any, ids: list[int], name: str, device: str) -> tuple[bool | None, str]:
    """Batch 8 from its 8th step on under sync debug mode: rows fed, positioned and (from ``numerics`` 2, for a
    cache that only appends) written and attended on the device."""
    engine = Engine(lm, bench_method(name, RHO), **ENGINE)
    if device == "cuda":
        engine.around_step = lambda step: _SyncsAreErrors() if step >= 8 else contextlib.nullcontext()
    done = list(engine.generate_batch(enumerate([Request(ids, 48)] * 8), 8))
    return (True if device == "cuda" else None), f"{len(done)} sequences, batch steps 8+ under sync debug mode"


def kernels_per_step(lm: Any, ids: list[int], name: str, batch: int = 1) -> float:
    """The profiler's kernels per steady step (steps 24-27) of ``batch`` copies of ``ids`` decoding together."""
    counted: list[int] = []

    def around(step: int) -> contextlib.AbstractContextManager:
        return _Profiled(counted) if step in (24, 25, 26, 27) else contextlib.nullcontext()

    engine = Engine(lm, bench_method(name, RHO), around_step=around, **ENGINE)
    list(engine.generate_batch(enumerate([Request(ids, 32)] * batch), batch))
    return statistics.mean(counted)


def kernels(lm: Any, ids: list[int], name: str, alone: dict[str, float]) -> tuple[bool | None, str]:
    alone[name] = kernels_per_step(lm, ids, name)
    return None, f"{alone[name]:.0f} kernels per steady step (profiler, steps 24-27)"


def batch_kernels(lm: Any, ids: list[int], name: str, alone: dict[str, float]) -> tuple[bool | None, str]:
    """Batch 8's kernels per step against batch 1's (target <= 1.5x: from ``numerics`` 2 one step serves every row)."""
    ratio = kernels_per_step(lm, ids, name, 8) / alone[name]
    return ratio <= 1.5, f"batch 8 runs {ratio:.2f}x batch 1's kernels per step (target <= 1.5)"


class _Profiled(contextlib.AbstractContextManager):
    def __init__(self, into: list[int]) -> None:
        self.into = into

    def __enter__(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities)
        self.profile.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.profile.__exit__(*exc)
        kernel = torch.autograd.DeviceType.CUDA if torch.cuda.is_available() else torch.autograd.DeviceType.CPU
        self.into.append(sum(1 for e in self.profile.events() if e.device_type == kernel))


def kept_sets(lm: Any, ids: list[int], name: str) -> list[torch.Tensor]:
    """The final positions table of every layer (the sequence's, read as it finishes)."""
    captured: list[list[torch.Tensor]] = []
    original = engine_module._Sequence.generation

    def keep(self: Any) -> Any:
        generation = original(self)
        captured.append([torch.as_tensor(p).cpu() for p in self.state.driver.positions])
        return generation

    engine_module._Sequence.generation = keep
    try:
        Engine(lm, bench_method(name, RHO), **ENGINE).generate(Request(ids, 32))
    finally:
        engine_module._Sequence.generation = original
    return captured[0]


def agreement(low: list[torch.Tensor], high: list[torch.Tensor]) -> float:
    scores = [jaccard(set(a[h].tolist()), set(b[h].tolist())) for a, b in zip(low, high, strict=True)
              for h in range(a.shape[0])]  # fmt: skip
    return statistics.mean(scores)


def speed(lm: Any, ids: list[int], repeats: int, new_tokens: int) -> dict[str, tuple[float, float, float]]:
    """Per method: median decode tok/s over ``repeats`` (after one warm-up), prefill and decode peak MiB."""
    budget = int((1 - RHO) * len(ids))
    out = {}
    for name in ("full@B", "inertia", "inertia_lazy", "score_free", "tova"):
        runs = []
        for _ in range(repeats + 1):
            engine = Engine(lm, FullCache() if name == "full@B" else bench_method(name, RHO), **ENGINE)
            runs.append(engine.generate(Request(ids[-budget:] if name == "full@B" else ids, new_tokens)))
        tok_s = statistics.median((g.new_tokens - 1) / g.decode_s for g in runs[1:])
        out[name] = (tok_s, runs[-1].prefill_peak_bytes / 2**20, runs[-1].decode_peak_bytes / 2**20)
        print(f"     {name}: {tok_s:.1f} tok/s, peaks {out[name][1]:.0f}/{out[name][2]:.0f} MiB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--length", type=int, default=65536, help="the speed check's prompt")
    parser.add_argument("--short", type=int, default=8192, help="the other checks' prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--numerics", type=int, default=4, help="the engine's numerics (harness.decode.engine)")
    args = parser.parse_args()
    ENGINE["numerics"] = args.numerics
    bf16 = model(args, "bfloat16")
    tokenizer = load_tokenizer(spec(args, "bfloat16"))  # KVzip's passes: the prompts' tokenizer (SmolLM2's)
    vocab = bf16.config.vocab_size
    short, long = prompt(args.short, vocab), prompt(args.length, vocab)
    for name in DECODE_METHODS:
        check(f"sync-free {name}", lambda name=name: sync_free(bf16, short, name, args.device))
    for name in ("full", "snapkv", "inertia"):
        check(f"sync-free {name} batch 8", lambda name=name: sync_free_batch(bf16, long[:2048], name, args.device))
    alone: dict[str, float] = {}
    for name in ("full", *DECODE_METHODS, "adakv_ea"):
        check(f"kernels {name}", lambda name=name: kernels(bf16, short, name, alone))
    for name in ("full", "inertia", "score_free", "adakv_ea"):
        check(f"kernels {name} batch 8", lambda name=name: batch_kernels(bf16, short, name, alone))
    low = {name: kept_sets(bf16, short, name) for name in DECODE_METHODS}
    del bf16
    fp32 = model(args, "float32")
    for name in DECODE_METHODS:
        check(
            f"bf16-fp32 {name}",
            lambda name=name, lm=fp32: (
                None,
                f"kept-set Jaccard {agreement(low[name], kept_sets(lm, short, name)):.3f}",
            ),
        )
    del fp32
    bf16 = model(args, "bfloat16")
    figures: dict[str, tuple[float, float, float]] = {}

    def timed() -> tuple[bool | None, str]:
        figures.update(speed(bf16, long, args.repeats, args.new_tokens))
        ratio = figures["inertia"][0] / figures["full@B"][0]
        return ratio >= 0.9, f"inertia {ratio:.2f}x full@B at {args.length} (target >= 0.9)"

    check("speed", timed)
    for name in LONG_METHODS:

        def finishes(name: str = name) -> tuple[bool | None, str]:
            g = Engine(bf16, bench_method(name, RHO), tokenizer=tokenizer, **ENGINE).generate(Request(long, 16))
            return True, (f"{(g.new_tokens - 1) / g.decode_s:.1f} tok/s, prefill {g.prefill_s:.1f} s, peaks "
                          f"{g.prefill_peak_bytes / 2**30:.1f}/{g.decode_peak_bytes / 2**30:.1f} GiB")  # fmt: skip

        check(f"at {args.length} {name}", finishes)
    print("\nsummary")
    for status, name, figure in results:
        print(f"  {status:4} {name}: {figure}")
    failed = sum(status == "FAIL" for status, _, _ in results)
    print(f"{failed} failed of {len(results)}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
