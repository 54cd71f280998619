"""RULER's needle-in-a-haystack (niah) synthesis.

Follows NVIDIA RULER at commit 533f013 (2025-07-10; the generator is unchanged at the
repository's head): ``scripts/data/synthetic/niah.py``, ``scripts/synthetic.yaml``,
``scripts/data/synthetic/constants.py``. The same task template, answer prefix, needle
sentence, noise sentence, 7-digit numbers / adjective-noun words / uuid4 draws, needle
placement, essay haystack repeated when a length asks for more words than it holds. The search
for the largest haystack whose prompt plus the tokens to generate fits the target length,
measured with the evaluated model's tokenizer, is shared by all RULER subtasks
(``tasks/ruler/fit.py``). RULER's essays are ``task.haystack=paul_graham_essays`` (read from
NVIDIA's package at run time); the default haystack is the bundled public-domain text.

Where we differ from that revision, and why:
- Every example draws from its own ``random.Random`` seeded by (seed, subtask, length,
  index), so a run with more examples extends a smaller one instead of reshuffling it. The
  needle order keeps RULER's fixed-seed shuffle (see ``tasks/ruler/task.py``).
- Word keys are an adjective and a noun drawn independently from the wonderwords lists, a
  uniform draw over the pairs RULER lists, without building its 6-million-entry list.
- When an example overflows the length found by the search, RULER drops a fixed step of
  haystack (500 essay words, 25 lines, 5 under 4096 tokens) and draws the example anew; we drop
  an estimate of the overflow and keep the example's keys and values, so prompts stay within a
  few tokens of the target (RULER's step: ``task.sizing=ruler``; an essay example then loses
  500 words, two thirds of a 1024-token prompt: 895 tokens become about 300).
- The search's lower bound is one haystack unit, not RULER's step, so short lengths with
  long needles (uuids at 512 tokens) still fit instead of looping forever.
- RULER splits essays into sentences with nltk's punkt model, which needs a download; we
  split after sentence-final punctuation followed by whitespace.
- RULER joins the essay's stretches and needles with a space even where a stretch is empty (a
  needle at depth 0 or 100, two needles at one depth), leaving a stray space at the start or
  end of the haystack; we leave it out: it carries nothing, and existing examples keep their ids.

Where NVIDIA's package (``nvidia-long-context-eval`` 26.3: RULER's code at c5341b4, 2024-12-04,
before the fixes of May 2025) differs from that revision, and so from us:
- It searches the haystack linearly, one step at a time from one step, and counts the answers
  into the prompt's length, so its prompts stop up to a step (and the answers' tokens) short.
- Its essay haystack is not repeated: lengths beyond the essays (525k words) get them once.
- The noise haystack is called ``repeat`` in its ``synthetic.yaml`` (``noise`` at 533f013).
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass

from tasks.ruler.fit import Sample
from tasks.ruler.words import wonderwords_list

TOKENS_TO_GENERATE = 128
TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# RULER: np.round(np.linspace(0, 100, num=40)); no value lands on .5, so round() agrees.
DEPTHS = tuple(round(100 * i / 39) for i in range(40))

HAYSTACKS = ("noise", "essay", "needle")
NEEDLE_TYPES = ("numbers", "words", "uuids")


@dataclass(frozen=True)
class NiahConfig:
    """One row of RULER's ``synthetic.yaml`` for the niah task."""

    haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1

    @property
    def num_keys(self) -> int:
        # RULER: every queried key must exist, so there are at least as many keys as queries.
        return max(self.num_needle_k, self.num_needle_q)

    @property
    def singular(self) -> bool:
        return self.num_needle_q * self.num_needle_v == 1

    def step(self, length: int) -> int:
        """RULER's haystack increment, in haystack units (words for essays, lines otherwise)."""
        if self.haystack == "essay":
            return 500
        return 5 if length < 4096 else 25


SUBTASKS: dict[str, NiahConfig] = {
    "niah_single_1": NiahConfig("noise", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", num_needle_q=4),
}


@dataclass
class NiahSample:
    """One synthesised example before tokenisation.

    ``depths`` are the needles' positions in percent of the haystack's lines (noise, needle)
    or sentences (essay), in the order the needles appear.
    """

    prompt: str
    answer_prefix: str
    answers: list[str]
    depths: list[float]
    num_haystack: int


def random_value(kind: str, rng: random.Random) -> str:
    """A needle key or value of RULER's type ``kind``."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(wonderwords_list('adjective'))}-{rng.choice(wonderwords_list('noun'))}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"needle type {kind!r} is not one of {NEEDLE_TYPES}")


def essay_words(text: str) -> list[str]:
    """RULER's essay haystack units: whitespace-separated words."""
    return re.sub(r"\s+", " ", text).strip().split(" ")


def split_sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def _noise_or_needle_context(
    config: NiahConfig, needles: list[str], num_haystack: int, rng: random.Random
) -> tuple[str, list[float]]:
    if config.haystack == "noise":
        sentences = [NOISE] * num_haystack
    else:
        sentences = [
            NEEDLE.format(
                type_needle_v=config.type_needle_v,
                key=random_value(config.type_needle_k, rng),
                value=random_value(config.type_needle_v, rng),
            )
            for _ in range(num_haystack)
        ]
    positions = sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
    # Inserting from the back keeps the earlier positions valid.
    for position, needle in zip(positions, needles, strict=True):
        sentences.insert(position, needle)
    depths = [100 * p / num_haystack for p in reversed(positions)]
    return "\n".join(sentences), depths


def _essay_context(
    needles: list[str], words: list[str], num_haystack: int, rng: random.Random
) -> tuple[str, list[float]]:
    repeats = -(-num_haystack // len(words))
    sentences = split_sentences(" ".join((words * repeats)[:num_haystack]))
    cuts = sorted(int(len(sentences) * depth / 100) for depth in rng.sample(DEPTHS, len(needles)))
    parts: list[str] = []
    previous = 0
    for cut, needle in zip(cuts, needles, strict=True):
        parts.extend(sentences[previous:cut])
        parts.append(needle)
        previous = cut
    parts.extend(sentences[previous:])
    depths = [100 * cut / len(sentences) for cut in cuts]
    return " ".join(parts), depths


def synthesize(
    config: NiahConfig, num_haystack: int, rng: random.Random, shuffle_seed: int, words: list[str] | None = None
) -> NiahSample:
    """Draw needles and build the RULER prompt around a haystack of ``num_haystack`` units.

    ``shuffle_seed`` orders the needles (RULER's fixed-seed shuffle); ``words`` is the essay
    corpus (``essay_words``), required for essay haystacks.
    """
    keys: list[str] = []
    values: list[list[str]] = []
    needles: list[str] = []
    for _ in range(config.num_keys):
        keys.append(random_value(config.type_needle_k, rng))
        values.append([random_value(config.type_needle_v, rng) for _ in range(config.num_needle_v)])
        needles.extend(NEEDLE.format(type_needle_v=config.type_needle_v, key=keys[-1], value=v) for v in values[-1])
    random.Random(shuffle_seed).shuffle(needles)

    if config.haystack == "essay":
        if not words:
            raise ValueError("the essay haystack needs a non-empty corpus")
        context, depths = _essay_context(needles, words, num_haystack, rng)
    else:
        context, depths = _noise_or_needle_context(config, needles, num_haystack, rng)

    queried = rng.sample(range(config.num_keys), config.num_needle_q)
    queries = [keys[i] for i in queried]
    answers = [v for i in queried for v in values[i]]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]

    template, prefix, type_needle_v = TEMPLATE, ANSWER_PREFIX, config.type_needle_v
    if config.singular:
        template, prefix = _singular(template), _singular(prefix)
        type_needle_v = type_needle_v[:-1]
    return NiahSample(
        prompt=template.format(type_needle_v=type_needle_v, context=context, query=query),
        answer_prefix=prefix.format(type_needle_v=type_needle_v, query=query),
        answers=answers,
        depths=depths,
        num_haystack=num_haystack,
    )


def _singular(text: str) -> str:
    # RULER's own rewrite for one expected answer, applied to the unfilled template.
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def as_sample(sample: NiahSample) -> Sample:
    """The subtask-independent view the shared fitting works on."""
    return Sample(
        prompt=sample.prompt,
        answer_prefix=sample.answer_prefix,
        answers=sample.answers,
        meta={"depths": [round(d, 2) for d in sample.depths], "num_haystack": sample.num_haystack},
    )
