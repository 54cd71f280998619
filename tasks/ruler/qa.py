"""RULER's question answering (qa_1: SQuAD v2 dev, qa_2: HotpotQA dev) synthesis.

Follows NVIDIA RULER (``scripts/data/synthetic/qa.py``, ``scripts/synthetic.yaml``
``qa_1: dataset squad``, ``qa_2: dataset hotpotqa``, ``scripts/data/synthetic/constants.py``):
the question's paragraph(s), then the other paragraphs of the same article (SQuAD), then
random paragraphs of the whole dev set fill the length; the documents are shuffled with
RULER's fixed seed (see ``tasks/ruler/task.py``: at a given document count the golden
paragraph sits at the same position in every example, as in RULER) and written
``Document N:\\n<text>`` separated by blank lines. SQuAD keeps answerable questions
only and every gold answer counts; HotpotQA paragraphs are ``title\\n<sentences joined>``.
Example ``i`` asks the dev set's ``i``-th (answerable) question, as RULER does. The haystack
unit is one document.

Data comes from the hub through ``datasets`` (``rajpurkar/squad_v2`` validation,
``hotpotqa/hotpot_qa`` distractor validation), or from a local file in the hub's schema.

Where we differ, and why:
- RULER always puts all ten distractor-setting paragraphs of a HotpotQA question in the
  prompt and cannot build one with fewer than ten documents. When fewer fit, we keep the
  supporting-fact paragraphs and a random draw of the other eight, so short lengths work;
  from ten documents on the selection is RULER's.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tasks.corpora import hub_dataset
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


SOURCES = {
    "squad": QaSource(
        "squad",
        "rajpurkar/squad_v2",
        None,
        "validation",
        "3ffb306f725f7d2ce8394bc1873b24868140c412",
        ("title", "context", "question", "answers"),
    ),
    "hotpotqa": QaSource(
        "hotpotqa",
        "hotpotqa/hotpot_qa",
        "distractor",
        "validation",
        "1908d6afbbead072334abe2965f91bd2709910ab",
        ("question", "answer", "supporting_facts", "context"),
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
    documents = sorted({doc for row in rows for _, doc in _hotpot_documents(row)})
    index = {doc: i for i, doc in enumerate(documents)}
    questions = []
    for row in rows:
        supporting = set(row["supporting_facts"]["title"])
        own = [(title in supporting, index[doc]) for title, doc in _hotpot_documents(row)]
        questions.append(
            Question(
                query=row["question"],
                answers=[row["answer"]],
                own=[i for _, i in own],
                more=[],
                golden=[i for gold, i in own if gold],
            )
        )
    return QaData(questions, documents)


def load(dataset: str, data_file: str | None, revision: str | None, option: str) -> QaData:
    """Read a dev set from the hub (``revision``, else the pinned commit), or from ``data_file`` in the
    hub's schema (``option`` names that field)."""
    source = SOURCES[dataset]
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
