"""RULER's word lists: the nouns, adjectives and verbs of the ``wonderwords`` package.

RULER reads them with ``wonderwords.random_word._get_words_from_text_file``; we read the same
asset files. wonderwords is pinned to 2.2.0, the release current when RULER was published:
3.0 dropped four nouns, which would shift every draw.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def wonderwords_list(name: str) -> tuple[str, ...]:
    """The distinct words of ``wonderwords/assets/<name>list.txt`` (``noun``, ``adjective``, ``verb``), sorted.

    RULER de-duplicates and sorts what it draws from (the adjective list repeats two words).
    """
    text = resources.files("wonderwords.assets").joinpath(f"{name}list.txt").read_text(encoding="utf-8")
    return tuple(sorted({line.rstrip() for line in text.splitlines()}))
