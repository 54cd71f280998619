"""What a task's example asks of the engine: its requests (stops, seeds, forcing), checked before any weights load."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from transformers import PretrainedConfig

from harness.decode.engine import Request, check_servable
from harness.decode.sampling import Sampling
from methods.base import EvictionMethod
from tasks.base import Call, Example, Task, TaskProtocol


def example_seed(seed: int, example_id: str) -> int:
    """The sampling seed of one example (or call) of a run: the run's seed and the example's own id."""
    return seed * 1_000_003 + zlib.crc32(example_id.encode())


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The model's end-of-turn ids: its generation config's and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    found = set(ids) if isinstance(ids, list) else ({ids} if ids is not None else set())
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


def stop_on_strings(tokenizer: Any, strings: list[str]) -> Callable[[list[int]], bool] | None:
    """A stop rule that ends generation once the last tokens' text holds one of ``strings``."""
    if not strings:
        return None
    return lambda tokens: any(s in tokenizer.decode(tokens[-16:], skip_special_tokens=True) for s in strings)


def example_request(task: Task, example: Example, tokenizer: Any, stops: set[int], seed: int) -> Request:
    """The engine request of an example that is one sequence (every protocol but ``CALLS`` and ``WORLD``)."""
    return Request(
        example.input_ids,
        example.max_new_tokens,
        stop_token_ids=stops | set(example.stop_token_ids),
        stop=stop_on_strings(tokenizer, task.stop_strings(example)),
        seed=example_seed(seed, example.example_id),
        forced=example.forced_ids if task.protocol is TaskProtocol.TEACHER_FORCED else None,
        min_new_tokens=example.min_new_tokens,
    )


def call_request(call: Call, tokenizer: Any, stops: set[int], seed: int, example_id: str) -> Request:
    """The engine request that serves one ``Call``, under the call's own sampling when it has one."""
    return Request(
        call.input_ids,
        call.max_new_tokens,
        stop_token_ids=stops,
        stop=stop_on_strings(tokenizer, call.stop_strings),
        seed=example_seed(seed, call.seed_key or example_id),
        forced=call.forced_ids,
        sampling=None if call.sampling is None else Sampling(**call.sampling),
    )


def check_call(config: PretrainedConfig, method: EvictionMethod, call: Call, what: str) -> None:
    """Refuse a call the model or the method cannot serve (``check_servable``), or that would not measure the method.

    A ranked continuation (a multiple-choice option) is scored from the prompt's prefill before
    the method evicts anything, its first tokens on the full cache: where the budget is below
    the prompt, the ranking would measure the full cache, not the method.
    """
    budget = check_servable(config, method, len(call.input_ids), call.max_new_tokens, what)
    if call.ranked and budget is not None and budget < len(call.input_ids):
        raise ValueError(
            f"{what}: a multiple-choice option is scored from the {len(call.input_ids)}-token prompt's prefill, before"
            f" method={method.name} evicts it to B={budget}, so the choice would measure the full cache — use a"
            f" generative variant of the task, rho=0, or method.selection.budget_tokens={len(call.input_ids)} or more"
        )


def check_examples(
    examples: list[Example],
    task: Task,
    config: PretrainedConfig,
    method: EvictionMethod,
    sampling: Sampling,
    diagnostics: bool,
) -> None:
    """Refuse, before any weights load, an example the model, the method or the run's options cannot serve."""
    for example in examples:
        what = f"example {example.example_id}"
        if task.protocol is not TaskProtocol.CALLS:
            check_servable(config, method, len(example.input_ids), example.max_new_tokens, what)
            continue
        if any(call.sampling is not None for call in example.calls) and sampling != Sampling():
            raise ValueError(
                f"sampling={sampling}: {what} samples as its task says (lm-eval's generation arguments)"
                " — set task.gen_kwargs='{do_sample: true, temperature: 0.6}' instead of sampling.*"
            )
        if diagnostics and len(example.calls) > 1:
            raise ValueError(
                f"diagnostics=true traces one sequence per record and {what} makes {len(example.calls)} calls"
                " — run diagnostics on a task with one generation per document"
            )
        for index, call in enumerate(example.calls):
            check_call(config, method, call, f"{what} call {index}")
