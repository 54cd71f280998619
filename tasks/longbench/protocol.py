"""LongBench's per-dataset protocol, as fixed by the official repository (THUDM/LongBench, ``LongBench/``).

Sources: ``config/dataset2prompt.json`` (prompts, typos included: they are part of the protocol),
``config/dataset2maxlen.json`` (new tokens), ``pred.py`` (datasets without a chat template, samsum's
newline stop) and ``eval.py`` (metric per dataset, first-line scoring, LongBench-E length buckets).
A LongBench-E dataset (``<name>_e``) uses its base dataset's prompt, length and metric: the official
``pred.py --e`` and ``eval.py --e`` key everything by the base name.
"""

from __future__ import annotations

PROMPTS: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. "
        "Answer the question asconcisely as you can, using a single phrase if possible. Do not "
        "provide any explanation.\n"
        "\n"
        "Story: {context}\n"
        "\n"
        "Now, answer the question based on the story asconcisely as you can, using a single "
        "phrase if possible. Do not provide any explanation.\n"
        "\n"
        "Question: {input}\n"
        "\n"
        "Answer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely "
        "as you can, using a single phrase or sentence if possible. If the question cannot be "
        'answered based on the information in the article, write "unanswerable". If the '
        'question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide '
        "any explanation.\n"
        "\n"
        "Article: {context}\n"
        "\n"
        " Answer the question based on the above article as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on "
        'the information in the article, write "unanswerable". If the question is a yes/no '
        'question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n'
        "\n"
        "Question: {input}\n"
        "\n"
        "Answer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n"
        "\n"
        "{context}\n"
        "\n"
        "Now, answer the following question based on the above text, only give me the answer "
        "and do not output any other words.\n"
        "\n"
        "Question: {input}\n"
        "Answer:"
    ),
    "multifieldqa_zh": (
        "阅读以下文字并用中文简短回答：\n"
        "\n"
        "{context}\n"
        "\n"
        "现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n"
        "\n"
        "问题：{input}\n"
        "回答："
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "The following are given passages.\n"
        "{context}\n"
        "\n"
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "Question: {input}\n"
        "Answer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "The following are given passages.\n"
        "{context}\n"
        "\n"
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "Question: {input}\n"
        "Answer:"
    ),
    "musique": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "The following are given passages.\n"
        "{context}\n"
        "\n"
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n"
        "\n"
        "Question: {input}\n"
        "Answer:"
    ),
    "dureader": (
        "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答："
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n"
        "\n"
        "Report:\n"
        "{context}\n"
        "\n"
        "Now, write a one-page summary of the report.\n"
        "\n"
        "Summary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. "
        "Answer the query in one or more sentences.\n"
        "\n"
        "Transcript:\n"
        "{context}\n"
        "\n"
        "Now, answer the query based on the above meeting transcript in one or more sentences.\n"
        "\n"
        "Query: {input}\n"
        "Answer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n"
        "\n"
        "News:\n"
        "{context}\n"
        "\n"
        "Now, write a one-page summary of all the news.\n"
        "\n"
        "Summary:"
    ),
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not "
        "output any other words. The following are some examples.\n"
        "\n"
        "{context}\n"
        "\n"
        "{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be "
        "duplicates. Please carefully read these paragraphs and determine how many unique "
        "paragraphs there are after removing duplicates. In other words, how many "
        "non-repeating paragraphs are there in total?\n"
        "\n"
        "{context}\n"
        "\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The "
        "output format should only contain the number, such as 1, 2, 3, and so on.\n"
        "\n"
        "The final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which "
        "paragraph the abstract is from.\n"
        "\n"
        "{context}\n"
        "\n"
        "The following is an abstract.\n"
        "\n"
        "{input}\n"
        "\n"
        "Please enter the number of the paragraph that the abstract is from. The answer format "
        'must be like "Paragraph 1", "Paragraph 2", etc.\n'
        "\n"
        "The answer is: "
    ),
    "passage_retrieval_zh": (
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n"
        "\n"
        "{context}\n"
        "\n"
        "下面是一个摘要\n"
        "\n"
        "{input}\n"
        "\n"
        '请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n'
        "\n"
        "答案是："
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "multifieldqa_zh": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "dureader": 128,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "vcsum": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "lsht": 64,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "passage_retrieval_zh": 32,
    "lcc": 64,
    "repobench-p": 64,
}

# pred.py: "chat models are better off without build prompts on these tasks" (few-shot and code).
NO_CHAT_TEMPLATE = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})

# eval.py scores only the first line of the prediction (after leading newlines) on these.
FIRST_LINE = frozenset({"trec", "triviaqa", "samsum", "lsht"})

# eval.py's dataset2metric, by metric name (see tasks.longbench.metrics.METRICS).
METRIC: dict[str, str] = {
    "narrativeqa": "qa_f1",
    "qasper": "qa_f1",
    "multifieldqa_en": "qa_f1",
    "multifieldqa_zh": "qa_f1_zh",
    "hotpotqa": "qa_f1",
    "2wikimqa": "qa_f1",
    "musique": "qa_f1",
    "dureader": "rouge_zh",
    "gov_report": "rouge",
    "qmsum": "rouge",
    "multi_news": "rouge",
    "vcsum": "rouge_zh",
    "trec": "classification",
    "triviaqa": "qa_f1",
    "samsum": "rouge",
    "lsht": "classification",
    "passage_retrieval_en": "retrieval",
    "passage_count": "count",
    "passage_retrieval_zh": "retrieval_zh",
    "lcc": "code_sim",
    "repobench-p": "code_sim",
}

# pred.py --e: the 13 datasets of LongBench-E, published as hub configs ``<name>_e``.
E_BASES = (
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)
DATASETS: tuple[str, ...] = tuple(PROMPTS)
DATASETS_E: tuple[str, ...] = tuple(f"{name}_e" for name in E_BASES)


def base_name(dataset: str) -> str:
    """The LongBench dataset whose protocol ``dataset`` follows (``qasper_e`` -> ``qasper``)."""
    if dataset in PROMPTS:
        return dataset
    if dataset in DATASETS_E:
        return dataset[: -len("_e")]
    raise ValueError(f"unknown LongBench dataset {dataset!r} — choose from {', '.join(DATASETS + DATASETS_E)}")


def length_bucket(length: int) -> str:
    """eval.py's LongBench-E interval of the record's ``length`` field (words, or characters for Chinese)."""
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"
