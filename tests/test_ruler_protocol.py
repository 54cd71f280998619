"""RULER's word lists, its fixed-seed shuffles and its qa document selection, against known values."""

from __future__ import annotations

import random
import re
from pathlib import Path

import datasets

from tasks.ruler import common_words, freq_words, niah, qa
from tasks.ruler.words import wonderwords_list

FIXTURES = Path(__file__).parent / "fixtures" / "ruler"
SEED = 42


def permutation(size: int, seed: int = SEED) -> list[int]:
    """Where RULER's ``random.Random(seed).shuffle`` sends the items of a list of ``size``: item order[j] lands at j."""
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return order


def test_wonderwords_lists_are_the_pinned_release() -> None:
    nouns, adjectives, verbs = (wonderwords_list(name) for name in ("noun", "adjective", "verb"))
    # 2.2.0's lists, de-duplicated (the adjective list repeats two words, the verb list one).
    assert (len(nouns), len(adjectives), len(verbs)) == (6786, 910, 1041)
    # A noun of 2.2.0 that 3.0 dropped: a different release would shift every draw.
    assert "brocolli" in nouns
    assert list(nouns) == sorted(nouns) and nouns[:3] == ("ATM", "CD", "SUV")
    assert len(common_words.word_pool(100)) == len(set(nouns) | set(adjectives) | set(verbs)) == 8169
    # Beyond wonderwords the pool grows with the bundled corpus, never repeating a word.
    pool = common_words.word_pool(9000)
    assert len(pool) > 9000 and len(set(pool)) == len(pool)


def test_word_keys_pair_an_adjective_with_a_noun() -> None:
    adjectives, nouns = set(wonderwords_list("adjective")), set(wonderwords_list("noun"))
    rng = random.Random(0)
    keys = [niah.random_value("words", rng) for _ in range(200)]
    for key in keys:
        assert any(key[:i] in adjectives and key[i + 1 :] in nouns for i, c in enumerate(key) if c == "-")
    assert len(set(keys)) == 200


def test_needles_keep_rulers_fixed_order() -> None:
    # niah_multivalue: one key, four values; the values appear in the essay in the order of
    # RULER's seed-42 shuffle of the needles, whatever the example's own draws.
    config = niah.SUBTASKS["niah_multivalue"]
    words = niah.essay_words("Alpha beta gamma. Delta epsilon zeta. Eta theta iota. Kappa lambda mu. " * 20)
    order = permutation(4)
    for example in range(3):
        sample = niah.synthesize(config, 200, random.Random(example), SEED, words)
        seen = re.findall(r"is: (\d{7})\.", sample.prompt)
        assert seen == [sample.answers[i] for i in order]


def test_cwe_common_words_sit_at_the_same_places() -> None:
    places = []
    for example in range(3):
        listing, common = common_words.word_list(40, 10, 3, 10, random.Random(example), SEED)
        entries = re.findall(r"\d+\. (\S+)", listing)
        assert len(entries) == 10 * 10 + 30 * 3
        places.append([i for i, word in enumerate(entries) if word in common])
    # RULER builds common*10 + rare*3 and shuffles it with seed 42: entry j holds item order[j].
    expected = [j for j, item in enumerate(permutation(190)) if item < 100]
    assert places == [expected] * 3
    other, common = common_words.word_list(40, 10, 3, 10, random.Random(0), 7)
    assert [i for i, w in enumerate(re.findall(r"\d+\. (\S+)", other)) if w in common] != expected


def test_fwe_ranks_sit_at_the_same_places() -> None:
    config = freq_words.FweConfig()
    counts = config.counts(600, config.vocab_size(1024))
    order = permutation(sum(counts))
    # Items 0..counts[0]-1 are the noise word, the next counts[1] the rank-2 word (the first answer).
    first = set(range(counts[0], counts[0] + counts[1]))
    expected = [j for j, item in enumerate(order) if item in first]
    for example in range(3):
        sample = freq_words.synthesize(config, 1024, 600, random.Random(example), SEED)
        words = sample.prompt.split("coded words. ", 1)[1].split("\n", 1)[0].split(" ")
        assert [j for j, word in enumerate(words) if word == sample.answers[0]] == expected


def test_squad_golden_document_sits_where_ruler_puts_it() -> None:
    data = qa.read_squad(datasets.load_dataset("json", data_files=str(FIXTURES / "squad_v2_validation.jsonl"))["train"])
    num_docs = len(data.documents) - 1
    # The question's own paragraph is item 0 of RULER's list, so it lands where the shuffle sends item 0.
    expected = permutation(num_docs).index(0) + 1
    for index in range(len(data.questions)):
        sample = qa.synthesize(data, index, num_docs, random.Random(index), SEED)
        assert sample.meta["golden_documents"] == [expected]
        assert f"Document {expected}:\n{data.documents[data.questions[index].golden[0]]}" in sample.prompt


def test_hotpotqa_uses_rulers_ten_paragraphs_in_dataset_order() -> None:
    rows = datasets.load_dataset("json", data_files=str(FIXTURES / "hotpot_qa_distractor_validation.jsonl"))["train"]
    data = qa.read_hotpotqa(rows)
    row, question = rows[0], data.questions[0]
    titles = row["context"]["title"]
    sample = qa.synthesize(data, 0, 10, random.Random(0), SEED)
    shown = re.findall(r"Document \d+:\n(.+)\n", sample.prompt)
    assert shown == [titles[i] for i in permutation(10)]
    assert sorted(shown[p - 1] for p in sample.meta["golden_documents"]) == ["Ada Brook", "Ben Carrow"]
    # More documents: the ten, then random others, all shuffled; fewer: the two supporting ones stay.
    longer = re.findall(r"Document \d+:\n(.+)\n", qa.synthesize(data, 0, 14, random.Random(0), SEED).prompt)
    assert set(titles) <= set(longer) and len(longer) == 14
    shorter = qa.synthesize(data, 0, 4, random.Random(0), SEED)
    assert len(shorter.meta["golden_documents"]) == 2 and len(question.own) == 10
