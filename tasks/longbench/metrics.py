"""LongBench's official scorers (THUDM/LongBench ``LongBench/metrics.py`` and ``eval.py``), reimplemented.

Each scorer maps one prediction and one gold answer to [0, 1]; ``score`` applies eval.py's
first-line rule, takes the maximum over the gold answers and scales by 100.

Two scorers are reimplemented rather than imported, so that the values do not depend on which
optional packages happen to be installed:

* ``rouge``: the official ``rouge`` package (1.0.1) ``Rouge().get_scores(avg=True)["rouge-l"]["f"]``,
  i.e. summary-level union-LCS ROUGE-L over sentences split at ``"."``, with word *sets*
  (``exclusive=True``). One deliberate difference: that package reconstructs each LCS
  recursively, so a sentence pair longer than Python's recursion limit allows raises
  ``RecursionError``, which the official bare ``except`` turns into 0; here it gets its real score.
* ``code_sim``: fuzzywuzzy's ``fuzz.ratio`` as installed by the official requirements (no
  python-Levenshtein), i.e. ``difflib.SequenceMatcher`` ratio rounded to an integer. With
  python-Levenshtein installed, fuzzywuzzy switches to an edit-distance ratio that can differ.

The Chinese scorers segment with jieba (``jieba==0.42.1``), imported on first use.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from functools import cache
from typing import Any

from tasks.longbench.protocol import FIRST_LINE, METRIC, base_name

_CN_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣"  # split only to keep lines short
    + "､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_EN_PUNCTUATION = frozenset(string.punctuation)
_ZH_PUNCTUATION = frozenset(string.punctuation + _CN_PUNCTUATION)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


@cache
def _jieba() -> Any:
    try:
        import jieba
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "LongBench's Chinese datasets are scored on jieba word segmentation: pip install jieba==0.42.1"
        ) from error
    return jieba


def _cut(text: str) -> list[str]:
    return list(_jieba().cut(text, cut_all=False))


def normalize_answer(text: str) -> str:
    """SQuAD-style English normalisation: lowercase, drop punctuation and articles, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _EN_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_zh_answer(text: str) -> str:
    """Chinese normalisation: lowercase, drop English and Chinese punctuation and all whitespace."""
    return "".join("".join(ch for ch in text.lower() if ch not in _ZH_PUNCTUATION).split())


def token_f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """Bag-of-tokens F1 (multiset overlap)."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction)
    recall = same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, ground_truth: str, **_: Any) -> float:
    """Token F1 after English normalisation."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh(prediction: str, ground_truth: str, **_: Any) -> float:
    """Token F1 over jieba words, each normalised, empty ones dropped."""
    pred = [word for word in (normalize_zh_answer(w) for w in _cut(prediction)) if word]
    gold = [word for word in (normalize_zh_answer(w) for w in _cut(ground_truth)) if word]
    return token_f1(pred, gold)


def _sentences(text: str) -> list[list[str]]:
    # The rouge package splits at "." (dropping empty pieces), squeezes whitespace inside each
    # sentence, then splits words at single spaces, so a blank sentence is one empty word.
    return [" ".join(piece.split()).split(" ") for piece in text.split(".") if piece]


def _lcs_words(reference: list[str], hypothesis: list[str]) -> set[str]:
    """Words of the LCS, traced back with the rouge package's tie-breaking (which LCS is chosen matters)."""
    rows, cols = len(reference), len(hypothesis)
    table = [[0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(1, rows + 1):
        above, row, word = table[i - 1], table[i], reference[i - 1]
        for j in range(1, cols + 1):
            row[j] = above[j - 1] + 1 if word == hypothesis[j - 1] else max(above[j], row[j - 1])
    words: set[str] = set()
    i, j = rows, cols
    while i > 0 and j > 0:
        if reference[i - 1] == hypothesis[j - 1]:
            words.add(reference[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge(prediction: str, ground_truth: str, **_: Any) -> float:
    """ROUGE-L F as the official ``rouge`` package computes it (summary-level union LCS over word sets)."""
    hypothesis, reference = _sentences(prediction), _sentences(ground_truth)
    if not hypothesis or not reference:
        # The package raises on an empty side; the official scorer catches it as 0.
        return 0.0
    union: set[str] = set()
    for ref_sentence in reference:
        for hyp_sentence in hypothesis:
            union |= _lcs_words(ref_sentence, hyp_sentence)
    recall = len(union) / len({w for s in reference for w in s})
    precision = len(union) / len({w for s in hypothesis for w in s})
    return 2.0 * precision * recall / (precision + recall + 1e-8)


def rouge_zh(prediction: str, ground_truth: str, **_: Any) -> float:
    """``rouge`` over jieba words joined by spaces."""
    return rouge(" ".join(_cut(prediction)), " ".join(_cut(ground_truth)))


def classification(prediction: str, ground_truth: str, *, all_classes: Sequence[str], **_: Any) -> float:
    """1/k when the gold class is among the k classes named in the prediction, after dropping
    named classes that are substrings of the gold class."""
    named = [name for name in all_classes if name in prediction]
    # The official loop removes items from the list it is iterating over, so the item right
    # after each removed one escapes the check; reproduced because it changes scores.
    index = 0
    while index < len(named):
        name = named[index]
        if name in ground_truth and name != ground_truth:
            named.remove(name)
        index += 1
    return 1.0 / len(named) if ground_truth in named else 0.0


def _number_share(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(number == target for number in numbers) / len(numbers) if numbers else 0.0


def count(prediction: str, ground_truth: str, **_: Any) -> float:
    """Share of the numbers in the prediction that equal the gold count."""
    return _number_share(prediction, str(ground_truth))


def retrieval(prediction: str, ground_truth: str, **_: Any) -> float:
    """Share of the numbers in the prediction that equal the gold paragraph number ("Paragraph N")."""
    return _number_share(prediction, re.findall(r"Paragraph (\d+)", ground_truth)[0])


def retrieval_zh(prediction: str, ground_truth: str, **_: Any) -> float:
    """Share of the numbers in the prediction that equal the gold paragraph number ("段落N")."""
    return _number_share(prediction, re.findall(r"段落(\d+)", ground_truth)[0])


def fuzz_ratio(first: str, second: str) -> int:
    """fuzzywuzzy 0.18 ``fuzz.ratio`` on its pure-Python path: equal -> 100, one empty -> 0."""
    if first == second:
        return 100
    if not first or not second:
        return 0
    return int(round(100 * SequenceMatcher(None, first, second).ratio()))


def code_sim(prediction: str, ground_truth: str, **_: Any) -> float:
    """fuzz ratio / 100 between the gold line and the first predicted line that is not a comment
    or a code fence (``#``, ``//`` or a backtick anywhere in it)."""
    line = next(
        (
            candidate
            for candidate in prediction.lstrip("\n").split("\n")
            if "`" not in candidate and "#" not in candidate and "//" not in candidate
        ),
        "",
    )
    return fuzz_ratio(line, ground_truth) / 100


METRICS: dict[str, Callable[..., float]] = {
    "qa_f1": qa_f1,
    "qa_f1_zh": qa_f1_zh,
    "rouge": rouge,
    "rouge_zh": rouge_zh,
    "classification": classification,
    "retrieval": retrieval,
    "retrieval_zh": retrieval_zh,
    "count": count,
    "code_sim": code_sim,
}


def score(dataset: str, prediction: str, answers: Sequence[str], all_classes: Sequence[str] | None) -> float:
    """eval.py's per-example score x100: first line where official, max over the gold answers."""
    base = base_name(dataset)
    if base in FIRST_LINE:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = METRICS[METRIC[base]]
    best = 0.0
    for answer in answers:
        best = max(best, metric(prediction, answer, all_classes=all_classes))
    return 100.0 * best
