"""The token ids of KVzip's context-reconstruction passes (Kim et al. 2025, arXiv:2505.23416).

A method asks for the passes in words (``methods.kvzip.ContextReconstruction``); this turns them
into ids with the evaluated model's tokenizer, as kvpress's ``KVzipPress`` does: per chunk of the
part of the prompt to reconstruct, the repeat instruction (plus, after the first chunk, the
previous chunk's last ``overlap`` tokens), the chat template's opening of the answer turn, then
the chunk itself.

Which part is reconstructed is the method's reading (``context``). The chat template's parts
are found as kvpress finds them: the template is rendered around a dummy user turn, and what
comes before the dummy is the opening (a system turn the template adds, the user turn's
header), what comes between it and the answer is the closing (the end of the user turn, the
assistant's header). ``after_template`` starts after the opening where the prompt begins with
its ids; ``user_content`` also ends at the last closing in the prompt (after it: a task's answer
prefix). A prompt without them (no chat template, ``chat_template=false``) is reconstructed from
its first or to its last token, as ``whole_prompt`` is. The method learns the span from the
passes (their ``start`` and ``end``), so it needs no tokenizer.
"""

from __future__ import annotations

from typing import Any

from methods.base import Reconstruction
from methods.kvzip import ContextReconstruction

_DUMMY = "dummy context"


def template_parts(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the chat template puts before a user turn's content and between it and the answer (none without one)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return [], []
    separator = "\n" + "#" * len(_DUMMY)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _DUMMY + separator}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    before, closing = text.split(separator)
    opening = before.split(_DUMMY)[0]
    return tokenizer.encode(opening, add_special_tokens=False), tokenizer.encode(closing, add_special_tokens=False)


def _last(ids: list[int], part: list[int], start: int) -> int | None:
    """Where the last occurrence of ``part`` in ``ids`` at or after ``start`` begins (None: nowhere)."""
    for at in range(len(ids) - len(part), start - 1, -1):
        if ids[at : at + len(part)] == part:
            return at
    return None


def reconstructed_span(prompt: list[int], opening: list[int], closing: list[int], context: str) -> tuple[int, int]:
    """``(start, end)``: the prompt positions the passes reconstruct under the reading ``context``, given the
    chat template's ``opening`` and ``closing`` ids (``template_parts``)."""
    start = len(opening) if context != "whole_prompt" and opening and prompt[: len(opening)] == opening else 0
    end = _last(prompt, closing, start) if context == "user_content" and closing else None
    # A closing right after the opening leaves no content: the whole rest is reconstructed.
    return start, end if end is not None and end > start else len(prompt)


def reconstruction_passes(tokenizer: Any, prompt: list[int], spec: Reconstruction) -> list[tuple[int, int, list[int]]]:
    """Per chunk of ``prompt``'s reconstructed span: ``(start, end, ids)``, the ids of the pass that
    reconstructs ``prompt[start:end]``. A plain ``Reconstruction`` reconstructs the whole prompt."""
    context = spec.context if isinstance(spec, ContextReconstruction) else "whole_prompt"
    opening, closing = template_parts(tokenizer)
    first_position, last_position = reconstructed_span(prompt, opening, closing, context)
    # kvpress's answer-turn opening is the closing, or a newline where there is no template.
    answer = closing or tokenizer.encode("\n", add_special_tokens=False)
    first = tokenizer.encode(spec.first, add_special_tokens=False)
    later = tokenizer.encode(spec.later, add_special_tokens=False)
    passes = []
    for start in range(first_position, last_position, spec.chunk):
        end = min(start + spec.chunk, last_position)
        previous = prompt[max(start - spec.overlap, first_position) : start]
        instruction = first if start == first_position else later + previous
        passes.append((start, end, instruction + answer + prompt[start:end]))
    return passes
