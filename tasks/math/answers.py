"""Final-answer extraction and answer equivalence for competition math (AIME, HMMT).

Extraction: the content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces
matched, ``\\boxed 5`` accepted); without any box, the text after the last "answer is" / "Answer:"
on its line, the phrasing models fall back to when they forget the box. A bare last number is
deliberately not a fallback: in a truncated reasoning it is whatever number came last, and crediting
it would reward the cut-off generations that cache eviction causes.

Equivalence: both sides are normalised (math delimiters, ``\\left``/``\\right``, ``\\dfrac``,
spacing commands, degree signs, ``\\text`` wrappers, units, ``x =`` prefixes, thousands separators);
equal strings match; otherwise both are converted with ``tasks.math.latex`` and compared numerically
(relative tolerance 1e-6) or, when they contain variables, by ``sympy.simplify`` of the difference
under a time limit. Comma-separated tuples compare element by element.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import sympy

    from tasks.math.latex import LatexError, to_sympy
except ImportError:  # sympy ships with torch, but equivalence must degrade, not fail, without it
    sympy = None

RELATIVE_TOLERANCE = 1e-6
SYMPY_SECONDS = 2.0

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*([^\n]*)", re.IGNORECASE)
_INLINE_MATH = re.compile(r"\$([^$]+)\$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_UNIT = re.compile(
    r"(?:units?|degrees?|cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot|ft|miles?|dollars?|cents?|"
    r"seconds?|minutes?|hours?|days?|ways|square|sq)(?:\^\{?\d\}?)?$"
)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ASSIGNMENT = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=")
_REMOVE = (
    r"\displaystyle", r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\ ", r"\qquad", r"\quad",
    "~", r"^{\circ}", r"^\circ", r"\circ", "°", r"\%", "%", r"\$", "$", r"\(", r"\)", r"\[", r"\]",
)  # fmt: skip


def _braced(text: str, start: int) -> int | None:
    """Index just past the brace group opening at ``text[start]``; None when it never closes."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed``/``\\fbox`` in ``text``, or None.

    A box left open by a generation cut at the token limit is skipped, so the latest complete box
    counts. ``\\boxed 5`` (no braces) takes the text up to the next space or ``$``.
    """
    for match in reversed(list(_BOX.finditer(text))):
        start = match.end()
        while start < len(text) and text[start] == " ":
            start += 1
        if start < len(text) and text[start] == "{":
            end = _braced(text, start)
            if end is not None:
                return text[start + 1 : end - 1]
        elif start > match.end():
            bare = re.match(r"[^\s$]+", text[start:])
            if bare:
                return bare.group()
    return None


def extract_answer(text: str) -> tuple[str | None, bool]:
    """(final answer, whether it came from a box); (None, False) when there is neither box nor phrase."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, True
    phrases = _ANSWER_PHRASE.findall(text)
    if not phrases:
        return None, False
    answer = phrases[-1]
    inline = _INLINE_MATH.search(answer)
    answer = (inline.group(1) if inline else answer).strip().rstrip(".").strip()
    return answer or None, False


def normalize(answer: str) -> str:
    """Canonical string form of an answer: the presentation-only parts of LaTeX removed."""
    text = answer.strip()
    for pattern in (r"\dfrac", r"\tfrac"):
        text = text.replace(pattern, r"\frac")
    for pattern in _REMOVE:
        text = text.replace(pattern, "")
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = re.sub(r"\s+", "", text)
    text = _ASSIGNMENT.sub("", text)
    text = text.rstrip(".")
    while True:
        stripped = _UNIT.sub("", text)
        # A unit is only dropped after a value: "degrees" alone stays a (wrong) answer.
        if stripped == text or not stripped:
            break
        text = stripped
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return text


def _split_top_level(text: str) -> list[str]:
    """Comma-separated items outside brackets, with one pair of enclosing brackets removed."""
    if len(text) > 1 and text[0] + text[-1] in ("()", "[]") and _balanced_inside(text[1:-1]):
        text = text[1:-1]
    items, depth, current = [], 0, []
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items


def _balanced_inside(text: str) -> bool:
    depth = 0
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if depth < 0:
            return False
    return depth == 0


class _Timeout(Exception):
    pass


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Interrupt sympy after ``seconds`` (main thread on POSIX only; elsewhere no limit applies)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _same_value(prediction: str, gold: str) -> bool:
    """Normalised single answers: equal strings, equal numbers, or symbolically equal expressions."""
    if prediction == gold:
        return True
    if sympy is None:
        return False
    try:
        with _time_limit(SYMPY_SECONDS):
            left, right = to_sympy(prediction), to_sympy(gold)
            if left.free_symbols or right.free_symbols:
                return bool(sympy.simplify(left - right) == 0)
            # sympy Floats, not Python floats: answers like 10^{10^{10}} overflow a float to inf.
            difference = sympy.Abs((left - right).evalf(30))
            scale = sympy.Max(1, sympy.Abs(right.evalf(30)))
            return (difference <= RELATIVE_TOLERANCE * scale) is sympy.true
    # LatexError: not an expression we parse; TypeError: comparisons with nan or zoo (a division by
    # zero); _Timeout: the time limit.
    except (LatexError, TypeError, ZeroDivisionError, _Timeout):
        return False


def is_equivalent(prediction: str | None, gold: str) -> bool:
    """Whether an extracted answer equals the gold answer (empty or missing answers never do)."""
    if prediction is None:
        return False
    left, right = normalize(prediction), normalize(gold)
    if not left or not right:
        return False
    if left == right:
        return True
    left_items, right_items = _split_top_level(left), _split_top_level(right)
    if len(left_items) != len(right_items):
        return False
    return all(_same_value(a, b) for a, b in zip(left_items, right_items, strict=True))
