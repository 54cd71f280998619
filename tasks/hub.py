"""Loading hub datasets through ``datasets``: a pinned hub copy, or local files in the hub's schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_rows(
    *,
    hub_id: str,
    revision: str | None,
    split: str,
    hub_data_dir: str | None = None,
    local_file: Path | None = None,
    how_to_get: str,
) -> list[dict[str, Any]]:
    """Rows of one split, from ``local_file`` (JSON or JSONL) when given, else from the hub.

    A missing file or an unreachable hub raises with ``how_to_get`` appended, so the user learns
    exactly which repository or file names the task expects.
    """
    from datasets import load_dataset

    if local_file is not None:
        if not local_file.is_file():
            raise FileNotFoundError(f"{local_file} does not exist. {how_to_get}")
        rows = load_dataset("json", data_files={split: str(local_file)}, split=split)
    else:
        try:
            rows = load_dataset(hub_id, data_dir=hub_data_dir, revision=revision, split=split)
        except Exception as error:
            # datasets raises several unrelated types here (offline mode, no network, missing
            # repo or revision, a loading script it refuses to run); all mean "not available".
            where = f"{hub_id}@{revision}" + (f" (data_dir={hub_data_dir})" if hub_data_dir else "")
            raise RuntimeError(f"could not load {where} from the hub: {error}. {how_to_get}") from error
    return [dict(row) for row in rows]
