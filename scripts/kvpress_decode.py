"""Decode speed of kvpress's decode-time press, for ``python -m harness.bench --kvpress <python>``.

Runs in a separate environment that has kvpress (it pins its own transformers), so it imports
nothing of evictbench:

    python3 -m venv kvpress-venv && kvpress-venv/bin/pip install torch==2.13.0 kvpress==0.5.5

Reads a JSON request ``{"model": <folder>, "ids": [...], "budget": B, "new_tokens": N, "threads": T,
"intervals": [...]}``
on stdin and prints one JSON row per configuration: transformers' ``generate`` on the full cache,
and under ``DecodingPress(KnormPress)`` that compresses to ``target_size = B`` every
``compression_interval`` steps. The decode time is the time of ``generate`` for N + 1 tokens minus
that for 1 token (the prefill and the first token), greedy, no stop token.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from importlib.metadata import version

import torch
from kvpress import DecodingPress, KnormPress
from transformers import AutoModelForCausalLM


def timed_generate(
    model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, press: object | None
) -> tuple[float, int]:
    """Seconds of ``generate`` for ``new_tokens`` tokens, and the entries cached per layer at the end."""
    context = press(model) if press is not None else contextlib.nullcontext()
    with context, torch.inference_mode():
        start = time.perf_counter()
        output = model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            return_dict_in_generate=True,
        )
        seconds = time.perf_counter() - start
    assert output.sequences.shape[1] == ids.shape[1] + new_tokens
    return seconds, output.past_key_values.get_seq_length()


def main() -> None:
    request = json.load(sys.stdin)
    torch.set_num_threads(request["threads"])
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32)
    model.eval()
    ids = torch.tensor([request["ids"]])
    steps = request["new_tokens"]
    configs = [("kvpress full", None)] + [
        (f"kvpress DecodingPress(Knorm, every {interval})", interval) for interval in request["intervals"]
    ]
    for label, interval in configs:

        def press(interval: int | None = interval) -> object | None:
            if interval is None:
                return None
            return DecodingPress(
                KnormPress(), compression_interval=interval, target_size=request["budget"], hidden_states_buffer_size=0
            )

        first, _ = timed_generate(model, ids, 1, press())
        whole, cached = timed_generate(model, ids, steps + 1, press())
        row = {"method": label, "decode_tok_s": steps / (whole - first), "prefill_s": first, "cache_len_final": cached}
        print(json.dumps(row | {"kvpress": version("kvpress"), "transformers": version("transformers")}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
