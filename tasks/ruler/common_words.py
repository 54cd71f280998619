"""RULER's common words extraction (cwe) synthesis.

Follows NVIDIA RULER at commit 533f013 (2025-07-10; the generator is unchanged at the
repository's head): ``scripts/data/synthetic/common_words_extraction.py``,
``scripts/synthetic.yaml`` ``cwe: freq_cw 30, freq_ucw 3, num_cw 10``,
``scripts/data/synthetic/constants.py``. A numbered list in which ``num_cw`` common words
appear ``freq_cw`` times and every other word ``freq_ucw`` times, shuffled; the answers are
the common words. Below 4096 tokens RULER lowers the repeats to 6 and 1 and shows one solved
list of 20 words (3 and 1 repeats), from 4096 on one of 40 words (10 and 3 repeats); the solved
list's answer follows its answer prefix after a space. The haystack unit is a distinct word.

The words come from the ``wonderwords`` noun, adjective and verb lists, as in RULER, and
every list is shuffled with RULER's fixed seed (see ``tasks/ruler/task.py``).

Where we differ from that revision, and why:
- When a list needs more distinct words than wonderwords holds (8169, around 100k tokens),
  RULER samples from its own ``english_words.json`` instead; we extend the wonderwords pool
  with the distinct lower-case words of the bundled public-domain corpus.
- The solved list is an earlier user/assistant exchange in the chat template (RULER
  concatenates two fully templated prompts with a newline, which is the same conversation
  written out by hand); without a chat template the text is RULER's exactly.
- RULER probes its search at 4096 words and bisects up to twice the size that predicts; the
  shared search (``tasks/ruler/fit.py``) probes at 10 words and bisects up to three times. Both
  find the largest list that fits the search's sample.

Where NVIDIA's package (``nvidia-long-context-eval`` 26.3: RULER's code at c5341b4, 2024-12-04,
before the fixes of May-July 2025) differs from that revision, and so from us:
- The solved list's answer follows the answer prefix with no space
  (``... in the list are:1. word 2. word``).
- The list is searched linearly in steps of 10 words, with the answer counted into the prompt,
  so prompts stop up to 10 words (and the answer's tokens) short; beyond wonderwords' 8169 words
  the size stops there.
lm-eval's ``ruler_cwe`` ports that code but leaves the solved list out of the prompt: it builds
one and does not show it to the model.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache

from tasks.corpora import read_text
from tasks.ruler.fit import Sample
from tasks.ruler.words import wonderwords_list

TOKENS_TO_GENERATE = 120
TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words "
    "in the above list?"
)
ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
# RULER's short-context regime and its solved-example sizes.
SHORT = 4096


@dataclass(frozen=True)
class CweConfig:
    """RULER's ``cwe`` row of ``synthetic.yaml``."""

    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10

    def step(self, length: int) -> int:
        """RULER's increment in distinct words."""
        return 10

    def repeats(self, length: int) -> tuple[int, int]:
        """(common, uncommon) repeats of the task's list at ``length``."""
        return (6, 1) if length < SHORT else (self.freq_cw, self.freq_ucw)

    def shot(self, length: int) -> tuple[int, int, int]:
        """(distinct words, common repeats, uncommon repeats) of the solved list."""
        return (20, 3, 1) if length < SHORT else (40, 10, 3)


@cache
def _wonderwords() -> tuple[str, ...]:
    return tuple(sorted({word for name in ("noun", "adjective", "verb") for word in wonderwords_list(name)}))


@cache
def _corpus_words() -> tuple[str, ...]:
    words = set(re.findall(r"\b[a-z]{3,}\b", read_text(None, "corpus")))
    return tuple(sorted(words - set(_wonderwords())))


def word_pool(count: int) -> tuple[str, ...]:
    """RULER's wonderwords pool, extended by the bundled corpus' vocabulary when ``count`` exceeds it."""
    base = _wonderwords()
    pool = base if count <= len(base) else base + _corpus_words()
    if count > len(pool):
        raise ValueError(f"cwe needs {count} distinct words but the word pool holds {len(pool)}")
    return pool


def numbered(words: list[str]) -> str:
    """RULER's ``1. word 2. word ...`` formatting."""
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def word_list(
    num_words: int, common: int, uncommon: int, num_cw: int, rng: random.Random, shuffle_seed: int
) -> tuple[str, list[str]]:
    """A numbered list of ``num_words`` distinct words (shuffled with ``shuffle_seed``) and its common words."""
    words = rng.sample(word_pool(num_words), num_words)
    frequent, rare = words[:num_cw], words[num_cw:]
    entries = frequent * common + rare * uncommon
    random.Random(shuffle_seed).shuffle(entries)
    return numbered(entries), frequent


def synthesize(config: CweConfig, length: int, num_words: int, rng: random.Random, shuffle_seed: int) -> Sample:
    """A cwe prompt of ``num_words`` distinct words, preceded by RULER's solved list."""
    shot_words, shot_common, shot_uncommon = config.shot(length)
    shot_context, shot_answers = word_list(shot_words, shot_common, shot_uncommon, config.num_cw, rng, shuffle_seed)
    common, uncommon = config.repeats(length)
    context, answers = word_list(num_words, common, uncommon, config.num_cw, rng, shuffle_seed)
    shot = (TEMPLATE.format(context=shot_context), f"{ANSWER_PREFIX} {numbered(shot_answers)}")
    return Sample(
        prompt=TEMPLATE.format(context=context),
        answer_prefix=ANSWER_PREFIX,
        answers=answers,
        shots=(shot,),
        meta={"num_haystack": num_words},
    )
