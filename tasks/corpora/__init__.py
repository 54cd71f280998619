"""Long public-domain prose bundled with the package, and the loaders that replace it.

The synthetic tasks need a prose haystack and the perplexity task a long text; both default
to the bundled text (see ``README.md`` here) so that nothing downloads at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

BUNDLED = Path(__file__).with_name("asv_genesis_numbers.txt")
BUNDLED_NAME = "asv_genesis_numbers"


def read_text(path: str | None, option: str) -> str:
    """The text of ``path``, or the bundled corpus when ``path`` is None.

    ``option`` names the config field the path came from, for the error message.
    """
    if path is None:
        return BUNDLED.read_text(encoding="utf-8")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{option}={path!r} is not a file (leave it null to use the bundled corpus)")
    text = file.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"{option}={path!r} is empty")
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
        rows = load_rows(self.path, self.name, self.split, self.revision, self.data_files, f"{option}.data_files")
        if self.column not in rows.column_names:
            raise ValueError(f"{self.path}: no column {self.column!r} (columns: {rows.column_names})")
        # The convention of transformers' perplexity guide for wikitext: rows joined by a blank line.
        return "\n\n".join(rows[self.column])


def checked_hub(file: str | None, hub: Mapping[str, Any] | None, file_option: str, hub_option: str) -> dict | None:
    """Validate a text source given as a file or as hub fields (not both); the hub fields as a plain dict.

    Hydra hands over a DictConfig; ``HubText`` refuses unknown field names.
    """
    if file is not None and hub is not None:
        raise ValueError(f"set {file_option} or {hub_option}, not both")
    if hub is None:
        return None
    fields = dict(hub)
    try:
        HubText(**fields)
    except TypeError as error:
        raise ValueError(
            f"{hub_option}: {error}; its fields are path, name, split, revision, column, data_files"
        ) from error
    return fields


def source_text(file: str | None, hub: Mapping[str, Any] | None, file_option: str, hub_option: str) -> str:
    """The text of the hub dataset ``hub`` (``HubText`` fields), else of ``file``, else the bundled corpus."""
    if hub is not None:
        return HubText(**hub).load(hub_option)
    return read_text(file, file_option)


def load_rows(
    path: str, name: str | None, split: str, revision: str | None, data_files: str | None, option: str
) -> datasets.Dataset:
    """A ``datasets.Dataset`` from the hub, or from ``data_files`` in the hub's schema.

    A dataset the hub cannot serve (offline, not cached) fails with a message that says how
    to get it; ``option`` names the config field that takes a local file instead.
    """
    import datasets

    if data_files is not None:
        if not Path(data_files).exists():
            raise FileNotFoundError(f"data file {data_files!r} does not exist")
        builder = "parquet" if data_files.endswith(".parquet") else "json"
        return datasets.load_dataset(builder, data_files=data_files, split="train")
    try:
        return datasets.load_dataset(path, name, split=split, revision=revision)
    except Exception as error:  # datasets raises several unrelated types when offline
        where = (
            f"{path}"
            + (f" ({name})" if name else "")
            + f", split {split!r}"
            + (f", revision {revision}" if revision else "")
        )
        raise RuntimeError(
            f"could not load {where} from the Hugging Face hub: {error}. Run once with network access "
            f"to fill the datasets cache (HF_HUB_OFFLINE unset), or pass {option}=path/to/file.jsonl, a local "
            f"json/jsonl/parquet copy in the hub's schema."
        ) from error
