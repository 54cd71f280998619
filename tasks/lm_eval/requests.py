"""lm-eval's requests as model calls, tokenised exactly as lm-eval's own ``hf`` model does.

lm-eval (EleutherAI's lm-evaluation-harness) hands a model ``Instance`` requests of three kinds:
``generate_until`` (a context and generation arguments), ``loglikelihood`` (a context and a
continuation to score) and ``loglikelihood_rolling`` (a text scored in windows of the model's
length). ``LmEvalRequests`` turns one request into the calls the harness serves and their
results back into lm-eval's response. It is lm-eval's ``HFLM`` holding a tokenizer and no model,
so prompts come from HFLM's own code (chat template, BOS handling, the context/continuation
split, left truncation, rolling windows) rather than a copy of it; HFLM's token-level scoring
hook ``_loglikelihood_tokens`` records the token pairs it is given instead of scoring them.

A generation stops at any of lm-eval's ``until`` strings (HFLM adds the end-of-text token's
text) and its output is cut at the first of them, as HFLM does; sampling follows the request's
``do_sample``/``temperature``/``top_k``/``top_p`` (unset top_k/top_p: no limit, where
transformers' ``generate`` would default top_k to 50).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lm_eval import utils
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM, TemplateLM
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import (
    configure_pad_token,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)

from tasks.base import Call, CallResult

SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}


def ranked_documents(requests: list[Instance]) -> set[tuple[str | None, int | None]]:
    """(task, document) pairs whose log-likelihood requests are ranked against each other.

    lm-eval asks a multiple-choice document for one log-likelihood per option; a document with
    a single log-likelihood request (a continuation scored on its own) is not ranked.
    """
    counts = Counter((r.task_name, r.doc_id) for r in requests if r.request_type == "loglikelihood")
    return {key for key, count in counts.items() if count > 1}


class LmEvalRequests(HFLM):
    """HFLM's prompt side: lm-eval requests to ``Call``s, ``CallResult``s to lm-eval responses.

    Parameters:
        tokenizer: the evaluated model's tokenizer (a pad token is set if it has none, as HFLM does).
        max_length: lm-eval's ``max_length``: contexts are left-truncated to it minus the
            generation length, and rolling windows span it. None: no truncation, one window
            per text (the harness then refuses what exceeds the model's positions).
    """

    def __init__(self, tokenizer: Any, max_length: int | None = None) -> None:
        LM.__init__(self)
        self.tokenizer = configure_pad_token(tokenizer)
        self.backend = "causal"
        self.add_bos_token = None
        self.custom_prefix_token_id = None
        self.truncation = False
        self.think_end_token = None
        self.enable_thinking = None
        self.chat_template_args: dict[str, Any] = {}
        self.batch_size_per_gpu = 1
        self._max_length = max_length
        self._recorded: list[tuple[list[int], list[int]]] = []

    @property
    def max_length(self) -> int | None:
        return self._max_length

    def calls(self, request: Instance, repeat: int = 0, ranked: bool = False) -> list[Call]:
        """The calls that answer ``request`` once (its ``repeat``-th time, which seeds sampling).

        ``ranked``: the request is one option of a multiple-choice document (``ranked_documents``).
        """
        seed_key = f"{request.task_name}/{request.doc_id:05d}/{request.idx}/{repeat}"
        if request.request_type == "generate_until":
            return [self._generation(request, seed_key)]
        if request.request_type == "loglikelihood":
            self._recorded = []
            TemplateLM.loglikelihood(self, [request], disable_tqdm=True)
            pairs = [self._fit(context, continuation, request) for context, continuation in self._recorded]
        elif request.request_type == "loglikelihood_rolling":
            tokens = self.tok_encode(request.args[0])
            windows = utils.get_rolling_token_windows(
                token_list=tokens,
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length or max(len(tokens), 1),
                context_len=1,
            )
            pairs = [utils.make_disjoint_window(window) for window in windows]
        else:
            raise ValueError(
                f"{request.task_name}: request type {request.request_type!r} is not one the engine serves"
                " — use a task whose requests are generate_until, loglikelihood or loglikelihood_rolling"
            )
        return [
            Call(input_ids=context, max_new_tokens=len(continuation), forced_ids=continuation, ranked=ranked)
            for context, continuation in pairs
        ]

    def response(self, request: Instance, results: list[CallResult]) -> Any:
        """lm-eval's response to ``request`` from the results of its ``calls``."""
        if request.request_type == "generate_until":
            (result,) = results
            return postprocess_generated_text(result.text, self._until(request), self.think_end_token)
        if request.request_type == "loglikelihood":
            (result,) = results
            return sum(result.logprobs), all(result.greedy)
        return sum(sum(result.logprobs) for result in results)

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, override_bs: Any = None) -> list:
        self._recorded.extend((context, continuation) for _, context, continuation in requests)
        return [(0.0, True)] * len(requests)

    def _fit(self, context: list[int], continuation: list[int], request: Instance) -> tuple[list[int], list[int]]:
        """HFLM's left truncation: context and continuation together keep the last ``max_length + 1`` tokens."""
        if self.max_length is None:
            return context, continuation
        if len(continuation) > self.max_length:
            raise ValueError(
                f"{request.task_name} document {request.doc_id}: a {len(continuation)}-token continuation exceeds"
                f" max_length={self.max_length} — raise task.max_length"
            )
        whole = (context + continuation)[-(self.max_length + 1) :]
        return whole[: len(whole) - len(continuation)], continuation

    def _until(self, request: Instance) -> list[str]:
        kwargs = normalize_gen_kwargs(request.args[1], self.max_gen_toks)
        return handle_stop_sequences(kwargs["until"], eos=self.tok_decode(self.eot_token_id, skip_special_tokens=False))

    def _generation(self, request: Instance, seed_key: str) -> Call:
        context, gen_kwargs = request.args
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        max_gen_toks = kwargs.pop("max_gen_toks")
        kwargs.pop("until")
        unknown = sorted(set(kwargs) - set(SAMPLING_KEYS))
        if unknown:
            raise ValueError(
                f"{request.task_name}: generation argument {unknown[0]}={kwargs[unknown[0]]!r} is not one the engine"
                f" serves — drop it (task.gen_kwargs, or lm-eval's --gen_kwargs); served: until, max_gen_toks,"
                f" {', '.join(SAMPLING_KEYS)}"
            )
        sampling = dict(GREEDY)
        if kwargs["do_sample"]:
            if not kwargs["temperature"] > 0:
                raise ValueError(
                    f"{request.task_name}: do_sample=True with temperature={kwargs['temperature']!r} — set a"
                    " temperature > 0 (e.g. task.gen_kwargs='{temperature: 0.6}'), or do_sample=false for greedy"
                )
            sampling = {
                "temperature": float(kwargs["temperature"]),
                "top_k": int(kwargs.get("top_k") or 0),
                "top_p": float(kwargs.get("top_p") or 1.0),
            }
        limit = self.max_length - max_gen_toks if self.max_length is not None else None
        if limit is not None and limit < 1:
            raise ValueError(
                f"{request.task_name}: max_gen_toks={max_gen_toks} leaves no room for a prompt in"
                f" max_length={self.max_length} — raise task.max_length or lower max_gen_toks"
            )
        ids, _ = self.tok_batch_encode([context], left_truncate_len=limit, truncation=self.truncation)
        return Call(
            input_ids=ids[0].tolist(),
            max_new_tokens=max_gen_toks,
            stop_strings=self._until(request),
            sampling=sampling,
            seed_key=seed_key,
        )
