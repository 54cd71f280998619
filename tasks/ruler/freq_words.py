"""RULER's frequent words extraction (fwe) synthesis.

Follows NVIDIA RULER at commit 533f013 (2025-07-10; the generator is unchanged at the
repository's head): ``scripts/data/synthetic/freq_words_extraction.py``,
``scripts/synthetic.yaml`` ``fwe: alpha 2.0``, ``scripts/data/synthetic/constants.py``. A
vocabulary of ``(length - 50) // 50`` random six-letter "coded" words, shuffled, whose rank-k
word appears ``int(num_words * k**-alpha / zeta(alpha))`` times; the top-ranked word is
replaced by ``...`` (noise the question tells the model to ignore), so the answers are the
words of ranks 2-4. The vocabulary and the word list are shuffled with RULER's fixed seed
(see ``tasks/ruler/task.py``). The haystack unit is ``num_words``, the nominal list size; the
prompt leaves room for the 50 generated tokens.

Where we differ from that revision, and why:
- RULER grows ``num_words`` linearly, from one word per six tokens in steps of 1/32 of the
  length, until the prompt reaches it, then steps back once; the default ``task.sizing=tight``
  uses the shared bisection (``tasks/ruler/fit.py``), which fits more tightly (RULER's search:
  ``task.sizing=ruler``).
- Lengths so short that ranks 2-5 would not get distinct counts are refused: the answer
  would be ambiguous.

Where NVIDIA's package (``nvidia-long-context-eval`` 26.3: RULER's code at c5341b4, 2024-12-04,
before the fix of June 2025, 9f1c84d) differs from that revision, and so from us:
- Its vocabulary has ``length // 50`` words and its prompt is fitted to the whole length, with
  no room left for the 50 generated tokens: prompt plus generation exceed the length.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from scipy.special import zeta

from tasks.ruler.fit import Sample

TOKENS_TO_GENERATE = 50
TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
NOISE_WORD = "..."
WORD_LENGTH = 6


@dataclass(frozen=True)
class FweConfig:
    """RULER's ``fwe`` row of ``synthetic.yaml``."""

    alpha: float = 2.0

    def vocab_size(self, length: int) -> int:
        """RULER: one coded word per 50 tokens of prompt budget."""
        return (length - TOKENS_TO_GENERATE) // 50

    def step(self, length: int) -> int:
        """RULER's increment: 1/32 of the prompt budget, in words."""
        return max((length - TOKENS_TO_GENERATE) // 32, 1)

    def start(self, length: int) -> int:
        """Where RULER's linear search starts: one word per six tokens of prompt budget."""
        return max((length - TOKENS_TO_GENERATE) // WORD_LENGTH, 1)

    def counts(self, num_words: int, vocab_size: int) -> list[int]:
        """Occurrences of the rank-1..V words (Zipf with exponent ``alpha``, truncated)."""
        norm = float(zeta(self.alpha))
        return [int(num_words * k**-self.alpha / norm) for k in range(1, vocab_size + 1)]

    def minimum(self, length: int) -> int:
        """Smallest ``num_words`` whose ranks 2-5 get strictly decreasing counts (so ranks 2-4 are the top 3)."""
        vocab = self.vocab_size(length)
        if vocab < 5:
            raise ValueError(
                f"task.lengths has {length!r}, too short for fwe: a vocabulary of {vocab} coded words, fewer than 5 "
                f"— use lengths of at least {TOKENS_TO_GENERATE + 5 * 50} for fwe"
            )
        num = 1
        while True:
            ranks = self.counts(num, 5)[1:]
            if all(a > b for a, b in zip(ranks, ranks[1:], strict=False)):
                return num
            num += 1


def synthesize(config: FweConfig, length: int, num_words: int, rng: random.Random, shuffle_seed: int) -> Sample:
    """An fwe prompt whose coded text has the rank counts of ``num_words``."""
    size = config.vocab_size(length)
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=WORD_LENGTH)))
    ranked = sorted(vocab)
    random.Random(shuffle_seed).shuffle(ranked)
    ranked[0] = NOISE_WORD
    words = [word for word, count in zip(ranked, config.counts(num_words, size), strict=True) for _ in range(count)]
    random.Random(shuffle_seed).shuffle(words)
    return Sample(
        prompt=TEMPLATE.format(context=" ".join(words)),
        answer_prefix=ANSWER_PREFIX,
        answers=ranked[1:4],
        meta={"num_haystack": num_words, "vocab_size": size},
    )
