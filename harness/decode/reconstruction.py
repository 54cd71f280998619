"""The token ids of KVzip's context-reconstruction passes (Kim et al. 2025, arXiv:2505.23416).

A method asks for the passes in words (``methods.base.Reconstruction``); this turns them into ids
with the evaluated model's tokenizer, as kvpress's ``KVzipPress`` does: per chunk of the prompt,
the repeat instruction (plus, after the first chunk, the previous chunk's last ``overlap``
tokens), the chat template's opening of the answer turn, then the chunk itself.

Reading: kvpress reconstructs the context after the chat template's prefix and leaves the
template's own entries beyond the first four unscored; the prompts here hold the context, the
question and the template together, so the whole prompt is reconstructed and every entry
gets a score.
"""

from __future__ import annotations

from typing import Any

from methods.base import Reconstruction

_DUMMY = "dummy context"


def answer_opening(tokenizer: Any) -> list[int]:
    """The ids the chat template puts between a user turn's content and the assistant's answer ("\\n" without one)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return tokenizer.encode("\n", add_special_tokens=False)
    separator = "\n" + "#" * len(_DUMMY)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _DUMMY + separator}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    return tokenizer.encode(text.split(separator)[1], add_special_tokens=False)


def reconstruction_passes(tokenizer: Any, prompt: list[int], spec: Reconstruction) -> list[tuple[int, int, list[int]]]:
    """Per chunk of ``prompt``: ``(start, end, ids)``, the ids of the pass that reconstructs ``prompt[start:end]``."""
    opening = answer_opening(tokenizer)
    first = tokenizer.encode(spec.first, add_special_tokens=False)
    later = tokenizer.encode(spec.later, add_special_tokens=False)
    passes = []
    for start in range(0, len(prompt), spec.chunk):
        end = min(start + spec.chunk, len(prompt))
        instruction = first if start == 0 else later + prompt[max(start - spec.overlap, 0) : start]
        passes.append((start, end, instruction + opening + prompt[start:end]))
    return passes
