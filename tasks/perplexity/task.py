"""Perplexity under eviction: teacher-forced next-token loss with the cache kept within budget.

StreamingLLM-style evaluation (Xiao et al. 2024, arXiv:2309.17453): each example is a window
of one long text, ``prefill`` tokens of prompt followed by ``eval_tokens`` tokens that the
engine feeds one at a time (``Example.forced_ids``) while the method evicts at every step
exactly as in generation; the budget is the method's B = floor((1 - rho) * prefill). The
log-probability of every forced token is scored, the first one from the prefill's logits.

Metrics: ``ppl`` = exp(mean NLL) of the window (primary; lower is better), ``nll`` (mean
negative log-likelihood in nats) and ``tokens``. The run summary averages per-window
perplexities; a corpus-level perplexity is exp of the token-weighted mean ``nll``.

Text: ``text_file``, else a hub dataset (``hub``, read through ``datasets``), else the
bundled public-domain text (``tasks/corpora``). Windows are consecutive and disjoint from
the start of the tokenised text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from tasks.base import Example, Task, TaskProtocol, require_int
from tasks.corpora import BUNDLED_NAME, checked_hub, hub_identity, source_text
from tasks.digest import content_digest


@dataclass
class PerplexityTask(Task):
    """Windows of a long text, scored by teacher forcing under eviction.

    Parameters:
        prefill: prompt tokens per window (L0, which the budget is computed from).
        eval_tokens: tokens teacher-forced and scored after the prompt.
        n: number of windows.
        text_file: a plain-text file to read instead of the bundled text.
        hub: a hub text dataset (fields of ``tasks.corpora.HubText``: path, name, split,
            revision, column, data_files), e.g. ``{path: wikitext, name: wikitext-103-raw-v1,
            split: test}``.
    """

    name: ClassVar[str] = "ppl"

    prefill: int = 1024
    eval_tokens: int = 256
    n: int = 4
    text_file: str | None = None
    hub: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for option, example in (("prefill", 1024), ("eval_tokens", 256), ("n", 4)):
            require_int(option, getattr(self, option), example=example)
        self.hub = checked_hub(self.text_file, self.hub, "task.text_file", "task.hub")

    @property
    def protocol(self) -> TaskProtocol:
        return TaskProtocol.TEACHER_FORCED

    def identity(self) -> dict[str, Any]:
        if self.hub is not None:
            source: Any = hub_identity(self.hub, "task.hub")
        else:
            source = content_digest(self.text_file, "task.text_file") or BUNDLED_NAME
        return {"source": source, "prefill": self.prefill, "eval_tokens": self.eval_tokens}

    def examples(self, tokenizer: Any) -> list[Example]:
        ids = list(
            tokenizer(
                source_text(self.text_file, self.hub, "task.text_file", "task.hub"),
                add_special_tokens=False,
                verbose=False,
            )["input_ids"]
        )
        # A model whose tokenizer opens every sequence with BOS sees one at each window's start.
        probe = tokenizer("a")["input_ids"]
        bos = [probe[0]] if tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id else []
        window = self.prefill - len(bos) + self.eval_tokens
        if len(ids) < self.n * window:
            raise ValueError(
                f"the text has {len(ids)} tokens, fewer than task.n={self.n} windows of "
                f"{window} tokens — lower task.n, task.prefill or task.eval_tokens, or use a longer text"
            )
        out = []
        for index in range(self.n):
            chunk = ids[index * window : (index + 1) * window]
            prompt = bos + chunk[: window - self.eval_tokens]
            out.append(
                Example(
                    example_id=f"ppl/{self.prefill}/{self.eval_tokens}/{index:04d}",
                    subtask="ppl",
                    input_ids=prompt,
                    answers=[],
                    max_new_tokens=self.eval_tokens,
                    meta={"length": self.prefill, "window_start": index * window},
                    forced_ids=chunk[window - self.eval_tokens :],
                )
            )
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        raise NotImplementedError("ppl is teacher-forced: the harness scores it through score_logprobs")

    def score_logprobs(self, logprobs: list[float], example: Example) -> dict[str, float]:
        expected = len(example.forced_ids or [])
        if len(logprobs) != expected or not logprobs:
            raise ValueError(f"{example.example_id}: {len(logprobs)} log-probabilities for {expected} forced tokens")
        nll = -math.fsum(logprobs) / len(logprobs)
        return {"ppl": math.exp(nll), "nll": nll, "tokens": float(len(logprobs))}
