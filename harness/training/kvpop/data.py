"""Training text for KVpop: the bundled public-domain corpus, a local file, or a hub dataset.

The paper trains on math reasoning traces (Nemotron-Math v2, high reasoning effort, traces of at
most ``S`` tokens, packed; Sec. 4); on CPU the scorer trains on the bundled text (``tasks/corpora``)
or any local file. ``token_windows`` cuts documents into windows that never cross a document
boundary; ``packed_windows`` fills windows with whole documents of at most ``S`` tokens.
A hub column may hold text or chat messages (``[{role, content}, ...]``, rendered with the chat
template).
"""

from __future__ import annotations

from typing import Any

from tasks.corpora import hub_dataset, read_text


def documents(data_file: str | None, hub: dict[str, Any] | None) -> list[str]:
    """The training documents: rows of ``hub`` (``path, name, split, revision, column, data_files``),
    else the text of ``data_file``, else the bundled corpus."""
    if hub is None:
        return [read_text(data_file, "data.file")]
    if data_file is not None:
        raise ValueError("data.file and data.hub are both set — set one of them")
    fields = dict(hub)
    if fields.get("revision") is None and fields.get("data_files") is None:
        raise ValueError(
            f"data.hub={fields} has no revision — pin a commit or tag of {fields.get('path')} (revision=...)"
        )
    column = fields.pop("column", "text")
    rows = hub_dataset(
        fields["path"],
        fields.get("name"),
        fields.get("split", "train"),
        fields.get("revision"),
        fields.get("data_files"),
        "data.hub.data_files",
    )
    if column not in rows.column_names:
        raise ValueError(f"{fields['path']}: no column {column!r} — set data.hub.column to one of {rows.column_names}")
    # Blank texts and empty conversations hold no tokens to train on.
    return [
        text for text in rows[column] if (isinstance(text, str) and text.strip()) or (isinstance(text, list) and text)
    ]


def bos_prefix(tokenizer: Any) -> list[int]:
    """``[bos]`` when the tokenizer opens every sequence with it (as ``task=ppl`` does), else ``[]``."""
    probe = tokenizer("a")["input_ids"]
    return [probe[0]] if tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id else []


def encode(tokenizer: Any, document: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a text, or of chat messages through the chat template."""
    if isinstance(document, list):
        text = tokenizer.apply_chat_template(document, tokenize=False)
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return tokenizer(document, add_special_tokens=False, verbose=False)["input_ids"]


def packed_windows(tokenizer: Any, texts: list[Any], length: int, count: int, skip: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens cut from the stream of documents, each closed by EOS
    (sequence packing); documents longer than a window are left out, as the paper keeps traces of
    at most ``S`` tokens."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    needed = (skip + count) * length
    for document in texts:
        ids = encode(tokenizer, document) + eos
        if len(ids) <= length:
            stream += ids
        if len(stream) >= needed:
            return [stream[start : start + length] for start in range(skip * length, needed, length)]
    raise ValueError(
        f"the training text packs into {len(stream) // length - skip} windows of {length} tokens after skipping "
        f"{skip}, fewer than the {count} asked for — lower the count, the skip or the window length, or add text"
    )


def token_windows(tokenizer: Any, texts: list[Any], length: int, count: int, skip: int) -> list[list[int]]:
    """``count`` disjoint windows of ``length`` tokens, after skipping the first ``skip`` windows.

    ``skip`` keeps training away from the start of the bundled text, where ``task=ppl`` takes its
    windows, and lets evaluation take held-out windows further on.
    """
    bos = bos_prefix(tokenizer)
    body = length - len(bos)
    out: list[list[int]] = []
    index = 0
    for text in texts:
        ids = encode(tokenizer, text)
        for start in range(0, len(ids) - body + 1, body):
            if index >= skip:
                out.append(bos + ids[start : start + body])
                if len(out) == count:
                    return out
            index += 1
    raise ValueError(
        f"the training text yields {max(index - skip, 0)} windows of {length} tokens after skipping {skip}, "
        f"fewer than the {count} asked for — lower the count, the skip or the window length, or add text"
    )
