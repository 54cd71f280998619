"""LongBench-v2's official protocol (THUDM/LongBench, repository root: ``pred.py``, ``prompts/``, ``result.py``)."""

from __future__ import annotations

import re

# prompts/0shot.txt, prompts/0shot_cot.txt and prompts/0shot_cot_ans.txt, verbatim (no final newline).
TEMPLATE_0SHOT = (
    "Please read the following text and answer the question below.\n"
    "\n"
    "<text>\n"
    "$DOC$\n"
    "</text>\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
TEMPLATE_0SHOT_COT = (
    "Please read the following text and answer the questions below.\n"
    "\n"
    "<text>\n"
    "$DOC$\n"
    "</text>\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    "Let’s think step by step:"
)
# The CoT answer pass: no document; $COT$ is the stripped reasoning of the first pass.
TEMPLATE_0SHOT_COT_ANS = (
    "Please read the following text and answer the questions below.\n"
    "\n"
    "The text is too long and omitted here.\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    "Let’s think step by step: $COT$\n"
    "\n"
    "Based on the above, what is the single, most likely answer choice? Format your response as follows: "
    '"The correct answer is (insert answer here)".'
)

# pred.py: max_new_tokens of the 0-shot answer (and of the CoT answer pass) and of the CoT reasoning pass.
MAX_NEW_TOKENS = 128
MAX_NEW_TOKENS_COT = 1024

_PLACEHOLDERS = (
    ("$DOC$", "context"),
    ("$Q$", "question"),
    ("$C_A$", "choice_A"),
    ("$C_B$", "choice_B"),
    ("$C_C$", "choice_C"),
    ("$C_D$", "choice_D"),
)


def fill(template: str, record: dict[str, str]) -> str:
    """pred.py's substitution: each field stripped, replaced one placeholder after the other.

    The order matters (a ``$Q$`` inside the document is replaced by the question), so it is kept.
    """
    for placeholder, key in _PLACEHOLDERS:
        template = template.replace(placeholder, record[key].strip())
    return template


def extract_answer(response: str) -> str | None:
    """pred.py's ``extract_answer``: the letter of "The correct answer is (X)" or "... is X", else None.

    Markdown bold is removed first; the parenthesised form wins when both occur.
    """
    response = response.replace("*", "")
    for pattern in (r"The correct answer is \(([A-D])\)", r"The correct answer is ([A-D])"):
        match = re.search(pattern, response)
        if match:
            return match.group(1)
    return None
