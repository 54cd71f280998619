"""LongBench's scorers against values produced by the official ``LongBench/metrics.py`` (rouge 1.0.1,
fuzzywuzzy 0.18.0 without python-Levenshtein, jieba 0.42.1) on the same inputs."""

from __future__ import annotations

import random

import pytest

from tasks.longbench import metrics
from tasks.longbench.metrics import score

WORKED = [
    # (metric, prediction, gold, official value)
    ("qa_f1", "The Eiffel Tower!", "eiffel tower", 1.0),
    ("qa_f1", "a cat sat on the mat", "the cat is on a mat", 0.75),
    ("qa_f1", "", "Paris", 0.0),
    ("qa_f1", "Paris, France.", "Paris", 2 / 3),
    ("rouge", "police killed the gunman", "police kill the gunman", 0.749999995),
    ("rouge", "the cat sat. the dog ran", "the dog sat. a cat ran", 0.9090909041322315),
    ("rouge", "a b", "b a", 0.4999999950000001),
    ("rouge", "the the the cat", "the cat", 0.999999995),
    ("rouge", "...", "a cat", 0.0),
    ("rouge", "", "a cat", 0.0),
    ("rouge", "Eve and Fred meet at noon.", "Eve and Fred will have lunch at noon at the cafe.", 0.6249999953125001),
    ("code_sim", "            found.append(name)\n", "            found.append(name)", 1.0),
    ("code_sim", "# add it\n            found.append(name)", "            found.append(name)", 1.0),
    ("code_sim", "```python\nfound.append(name)", "            found.append(name)", 0.75),
    ("code_sim", "\n\nreturn found", "            found.append(name)", 0.29),
    ("code_sim", "", "x = 1", 0.0),
    ("code_sim", "// c\n# d", "x = 1", 0.0),
    ("count", "There are 2 unique paragraphs", "2", 1.0),
    ("count", "2 or 3", "2", 0.5),
    ("count", "none", "2", 0.0),
    ("count", "12", "2", 0.0),
    ("retrieval", "Paragraph 2", "Paragraph 2", 1.0),
    ("retrieval", "Paragraph 12 or 2", "Paragraph 2", 0.5),
    ("retrieval", "no idea", "Paragraph 2", 0.0),
    ("retrieval_zh", "段落3", "段落3", 1.0),
    ("retrieval_zh", "段落1和段落3", "段落3", 0.5),
]

CHINESE = [
    ("qa_f1_zh", "北京。", "北京", 1.0),
    ("qa_f1_zh", "他住在北京市", "北京", 0.0),
    ("rouge_zh", "会议讨论了预算问题", "会议讨论预算", 0.7499999953125),
    ("rouge_zh", "", "会议", 0.0),
]


@pytest.mark.parametrize(("metric", "prediction", "gold", "expected"), WORKED)
def test_official_values(metric: str, prediction: str, gold: str, expected: float) -> None:
    assert metrics.METRICS[metric](prediction, gold) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("metric", "prediction", "gold", "expected"), CHINESE)
def test_official_values_chinese(metric: str, prediction: str, gold: str, expected: float) -> None:
    assert metrics.METRICS[metric](prediction, gold) == pytest.approx(expected, abs=1e-12)


CLASSES = ["City", "Country", "Individual", "Description of a person", "person", "Date"]


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("City", "City", 1.0),
        ("City or Country", "City", 0.5),
        ("Description of a person", "Description of a person", 1.0),
        ("person Description of a person", "Description of a person", 1.0),
        ("Individual person", "Description of a person", 0.0),
        ("Date", "City", 0.0),
    ],
)
def test_classification(prediction: str, gold: str, expected: float) -> None:
    assert metrics.classification(prediction, gold, all_classes=CLASSES) == expected


def test_classification_keeps_the_official_skip() -> None:
    # "a" is removed as a substring of the gold class, which makes the loop skip "ab": the
    # official scorer gives 0.5 here, not 1.0.
    assert metrics.classification("abc", "abc", all_classes=["a", "ab", "abc"]) == 0.5


def test_fuzz_ratio_edge_cases() -> None:
    assert metrics.fuzz_ratio("", "") == 100
    assert metrics.fuzz_ratio("abc", "") == 0
    assert metrics.fuzz_ratio("abcd", "abce") == 75


def test_score_max_over_answers_and_scale() -> None:
    assert score("narrativeqa", "Pepper", ["A red dog called Pepper", "Pepper"], None) == 100.0
    assert score("narrativeqa", "a red dog", ["Pepper", "A red dog called Pepper"], None) == pytest.approx(
        100 * 2 * (2 / 2) * (2 / 4) / (2 / 2 + 2 / 4)
    )
    assert score("narrativeqa", "", ["Pepper"], None) == 0.0


def test_first_line_scoring_only_where_official() -> None:
    assert score("trec", "\n\nCity\nType: Date", ["City"], CLASSES) == 100.0
    assert score("trec_e", "\nCity\nDate", ["City"], CLASSES) == 100.0
    assert score("samsum", "Eve and Fred meet.\nDialogue: x", ["Eve and Fred meet."], None) == pytest.approx(
        100 * metrics.rouge("Eve and Fred meet.", "Eve and Fred meet.")
    )
    # narrativeqa scores the whole prediction: the second line dilutes the F1.
    assert score("narrativeqa", "Pepper\nthe dog", ["Pepper"], None) == pytest.approx(100 * 2 / 3)


def test_lcc_skips_comment_lines() -> None:
    assert score("lcc_e", "\n# comment\n    return x", ["    return x"], None) == 100.0


def test_rouge_matches_the_official_package() -> None:
    import rouge

    scorer = rouge.Rouge()
    words = ["the", "cat", "Cat", "sat", "on", "mat", ".", "dog", ",", "a", "", " ", "\n", "3.5", "x", "A."]
    rng = random.Random(0)
    for _ in range(300):
        hyp = " ".join(rng.choice(words) for _ in range(rng.randint(0, 20)))
        ref = " ".join(rng.choice(words) for _ in range(rng.randint(0, 20)))
        try:
            expected = scorer.get_scores([hyp], [ref], avg=True)["rouge-l"]["f"]
        except ValueError:
            expected = 0.0
        assert metrics.rouge(hyp, ref) == pytest.approx(expected, abs=1e-12), (hyp, ref)
