"""Prompt -> prefill ids for the LongBench family: middle truncation, then the chat template."""

from __future__ import annotations

from typing import Any


def truncate_middle(tokenizer: Any, prompt: str, max_length: int, *, tail_rounds_up: bool = False) -> tuple[str, bool]:
    """Cut the middle of ``prompt`` so its tokenisation keeps at most about ``max_length`` tokens.

    As in the official ``pred.py`` scripts: tokenise with the tokenizer's default special
    tokens, and if longer than ``max_length`` keep the first and last halves of the ids and
    decode them back to text (special tokens skipped), before any chat template. LongBench
    keeps ``max_length // 2`` tokens on each side; LongBench-v2 slices ``[-max_length // 2:]``,
    which keeps one more tail token when ``max_length`` is odd (``tail_rounds_up``).
    Returns the text and whether it was cut.
    """
    ids = tokenizer(prompt, verbose=False)["input_ids"]
    if len(ids) <= max_length:
        return prompt, False
    head = max_length // 2
    tail = max_length - head if tail_rounds_up else head
    text = tokenizer.decode(ids[:head], skip_special_tokens=True) + tokenizer.decode(
        ids[len(ids) - tail :], skip_special_tokens=True
    )
    return text, True


def encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Prefill ids: the prompt as the single user turn of the chat template, or raw.

    Raw prompts get the tokenizer's default special tokens (a BOS where the model uses one), as
    ``tokenizer(prompt)`` does in the official scripts; a rendered chat template already carries
    the special tokens it wants.
    """
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    return list(tokenizer(prompt, verbose=False)["input_ids"])
