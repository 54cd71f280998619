"""evictbench as an lm-eval model: any lm-eval task under any eviction method.

    python -m harness.lm_eval_model --model evictbench \\
        --model_args model=smollm2_135m,method=inertia,rho=0.9 --tasks niah_single_1 --limit 4

lm-eval 0.4.13 resolves ``--model`` in its own registry only (it reads no plugin entry points),
so this module is lm-eval's command line with ``evictbench`` registered; from Python,
``import harness.lm_eval_model`` registers it for ``lm_eval.simple_evaluate(model="evictbench")``.
Every other option is lm-eval's own.

``--model_args`` are ``harness.run`` overrides and mean what they mean there: ``model=``,
``method=``, ``rho=``, ``seed=``, ``threads=`` and any field of them
(``method.selection.budget_tokens=256``, ``model.dtype=bfloat16``). Sampling comes from lm-eval's
generation arguments (the task's, or ``--gen_kwargs``); ``--device`` places the model unless
``model.device`` is given, and a CUDA device without CUDA falls back as lm-eval's hf model does.

Requests are tokenised by lm-eval's ``hf`` model code (``tasks.lm_eval.requests``) and served by
the engine under the method, ``--batch_size`` sequences decoding together (``auto``: 1; each
sequence keeps its own keep sets, ``Engine.generate_batch``): a generation
decodes with the method evicting at every step; a log-likelihood prefills the context and
teacher-forces the continuation while the method evicts, its budget ``B = floor((1 - rho) *
context)`` or ``budget_tokens``, as the ``ppl`` task does (a rolling window's context is one
token: give it ``method.selection.budget_tokens``). A multiple-choice document under a method
that would evict its context is refused (``harness.run.check_call``). Synthetic tasks that size
their documents with a tokenizer (RULER) are given the evaluated model's unless ``--metadata``
names one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from hydra.utils import instantiate
from lm_eval.__main__ import HarnessCLI
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.utils import resolve_max_length
from lm_eval.utils import setup_logging
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from harness.config import check_options, check_top_level, compose_config
from harness.decode import kv_cache
from harness.decode.engine import Engine
from harness.errors import cli, user_errors
from harness.models import ModelSpec, load_config, load_model, load_tokenizer
from harness.options import check_types
from harness.protocols.requests import call_request, check_call, stop_token_ids
from methods.base import EvictionMethod
from tasks.base import Call, CallResult
from tasks.lm_eval.requests import LmEvalRequests, ranked_documents

#: Top-level options a ``--model_args`` key may set (itself or a field of it).
MODEL_ARGS = ("model", "method", "rho", "seed", "threads")


def overrides(model_args: dict[str, Any], device: str | None = None) -> list[str]:
    """``--model_args`` (parsed by lm-eval) as ``harness.run`` overrides, ``device`` as ``model.device``."""
    out = []
    for key, value in model_args.items():
        root = key.lstrip("+~").replace("/", ".").split(".")[0]
        if root not in MODEL_ARGS:
            raise ValueError(
                f"--model_args {key}={value!r} is not an evictbench model argument — use {', '.join(MODEL_ARGS)} and"
                " their fields (method.selection.budget_tokens=256); sampling comes from --gen_kwargs, task data"
                " (RULER's tokenizer, max_seq_lengths) from --metadata"
            )
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        out.append(f"{key}={text}")
    # lm-eval's command line passes cuda:0 by default; without CUDA its hf model then picks the device itself.
    unavailable = device is not None and torch.device(device).type == "cuda" and not torch.cuda.is_available()
    if device is not None and "model.device" not in model_args and not unavailable:
        out.append(f"model.device={device}")
    return out


def batch_sequences(batch_size: int | str) -> int:
    """lm-eval's ``--batch_size`` as the engine's: a positive integer, or auto (1: a memory search would
    have to run each method's budget at its longest prompt)."""
    text = str(batch_size)
    if text == "auto" or text.startswith("auto:"):
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--batch_size {batch_size!r} is not a positive integer — use e.g. --batch_size 8")
    return int(text)


def compose(model_args: dict[str, Any], device: str | None = None) -> DictConfig:
    """The harness config ``--model_args`` describe, checked as ``harness.run`` checks it."""
    with user_errors():
        cfg = compose_config(*overrides(model_args, device))
        check_top_level(cfg)
        check_options(cfg, overrides(model_args, device))
    return cfg


@register_model("evictbench")
class EvictbenchLM(LmEvalRequests):
    """An lm-eval model that runs the evictbench engine under an eviction method.

    Parameters:
        batch_size: lm-eval's ``--batch_size``: sequences the engine decodes together (auto: 1).
        max_batch_size: ignored (lm-eval's bound for auto batch sizes).
        device: lm-eval's ``--device`` (see the module docstring).
        **model_args: ``harness.run`` overrides (``model=``, ``method=``, ``rho=``, ...).
    """

    def __init__(
        self, batch_size: int | str = 1, max_batch_size: int | None = None, device: str | None = None, **model_args: Any
    ) -> None:
        with user_errors():
            self.cfg = compose(model_args, device)
            self.decode_batch = batch_sequences(batch_size)
            spec = ModelSpec.from_config(self.cfg.model)
            self.method: EvictionMethod = instantiate(self.cfg.method)
            check_types(self.method, "method")
            tokenizer = load_tokenizer(spec)
            self.model_config = load_config(spec)
            kv_cache.check_layers(self.model_config, spec.name)
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        model = load_model(spec)
        super().__init__(tokenizer, resolve_max_length(model.config, tokenizer))
        self._model, self._config, self._device = model, model.config, model.device
        self.spec = spec
        self.engine = Engine(model, self.method, tokenizer=tokenizer, numerics=self.cfg.numerics)
        self.stops = stop_token_ids(model, tokenizer)

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        return self._answer(requests, "generate_until", disable_tqdm)

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._answer(requests, "loglikelihood", disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        return self._answer(requests, "loglikelihood_rolling", disable_tqdm)

    def get_model_info(self) -> dict[str, Any]:
        method = OmegaConf.to_container(self.cfg.method, resolve=True)
        return {"evictbench": {"model": self.spec.identity(self._device), "method": method}}

    def _answer(self, requests: list[Instance], kind: str, disable_tqdm: bool) -> list[Any]:
        """lm-eval's responses to ``requests``, every call checked before the first is served."""
        ranked = ranked_documents(requests)
        seen: Counter[tuple[Any, ...]] = Counter()
        planned: list[list[Call]] = []
        with user_errors():
            for request in requests:
                # lm-eval repeats a request ``repeats`` times in a row; each repeat samples anew.
                key = (request.task_name, request.doc_id, request.idx)
                calls = self.calls(request, seen[key], ranked=(request.task_name, request.doc_id) in ranked)
                seen[key] += 1
                for call in calls:
                    check_call(self.model_config, self.method, call, f"{request.task_name} document {request.doc_id}")
                planned.append(calls)
        progress = tqdm(total=len(requests), desc=f"Running {kind} requests", disable=disable_tqdm)
        groups = [
            [call_request(call, self.tokenizer, self.stops, self.cfg.seed, "") for call in calls] for calls in planned
        ]
        responses: list[Any] = [None] * len(requests)
        for number, generations in self.engine.generate_groups(groups, self.decode_batch):
            results = [
                CallResult(
                    "" if call.forced_ids is not None else self.tokenizer.decode(g.tokens, skip_special_tokens=True),
                    g.target_logprobs,
                    g.target_greedy,
                )
                for call, g in zip(planned[number], generations, strict=True)
            ]
            responses[number] = self.response(requests[number], results)
            progress.update(1)
        progress.close()
        return responses


def main() -> None:
    """lm-eval's command line, with ``evictbench`` registered and the model's tokenizer given to synthetic tasks."""
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    metadata = getattr(args, "metadata", None) or {}
    if getattr(args, "model", None) == "evictbench" and "tokenizer" not in metadata:
        model_args = getattr(args, "model_args", None) or {}
        with user_errors():
            spec = ModelSpec.from_config(compose(model_args).model)
            args.metadata = {**metadata, "tokenizer": load_tokenizer(spec).name_or_path}
    parser.execute(args)


if __name__ == "__main__":
    cli(main)
