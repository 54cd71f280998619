"""A small LaTeX-to-sympy converter for competition answers: numbers, ``+ - * /``, ``^``, ``\\frac``,
``\\sqrt`` (with an optional index), ``\\cdot``/``\\times``/``\\div``, ``\\pi``, single-letter variables,
parentheses/braces and implicit multiplication (``2\\sqrt{3}``, ``3\\pi``).

Anything else (sets, intervals, ``\\binom``, words) raises ``LatexError`` and the caller falls back to
comparing normalised strings. Powers are built unevaluated so that an answer like ``10^{10^{10}}``
cannot make sympy compute a gigantic integer; callers compare through ``evalf``.
"""

from __future__ import annotations

import re
from typing import Any

import sympy

_TOKEN = re.compile(r"\\[a-zA-Z]+|\d+\.?\d*|\.\d+|[a-zA-Z]|[-+*/^(){}\[\]]")
_MULTIPLY = {"*", r"\cdot", r"\times"}
_DIVIDE = {"/", r"\div"}


class LatexError(ValueError):
    """The expression uses LaTeX this converter does not understand."""


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    for match in _TOKEN.finditer(text):
        if match.start() != position:
            raise LatexError(f"unexpected {text[position : match.start()]!r} in {text!r}")
        tokens.append(match.group())
        position = match.end()
    if position != len(text):
        raise LatexError(f"unexpected {text[position:]!r} in {text!r}")
    return tokens


class _Parser:
    """Recursive descent over the tokens; one instance per expression."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.index = 0

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise LatexError(f"expected {expected or 'more input'}, found {token!r}")
        self.index += 1
        return token

    def parse(self) -> Any:
        value = self.sum()
        if self.peek() is not None:
            raise LatexError(f"unexpected {self.peek()!r}")
        return value

    def sum(self) -> Any:
        value = self.product()
        while self.peek() in ("+", "-"):
            value = value + self.product() if self.take() == "+" else value - self.product()
        return value

    def product(self) -> Any:
        value = self.signed()
        while True:
            token = self.peek()
            if token in _MULTIPLY:
                self.take()
                value = value * self.signed()
            elif token in _DIVIDE:
                self.take()
                value = value / self.signed()
            elif self.starts_atom(token):
                value = value * self.power()
            else:
                return value

    def signed(self) -> Any:
        if self.peek() == "-":
            self.take()
            return -self.signed()
        if self.peek() == "+":
            self.take()
            return self.signed()
        return self.power()

    def power(self) -> Any:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        negative = self.peek() == "-"
        if negative:
            self.take()
        exponent = self.argument()
        return sympy.Pow(base, -exponent if negative else exponent, evaluate=False)

    @staticmethod
    def starts_atom(token: str | None) -> bool:
        if token is None:
            return False
        return (
            token[0].isdigit() or token[0] == "." or token.isalpha() or token in ("(", "{", r"\frac", r"\sqrt", r"\pi")
        )

    def argument(self) -> Any:
        """A command argument or exponent: a braced group, else one character (``\\frac12``, ``x^23`` = x^2*3)."""
        token = self.peek()
        if token is not None and token[0].isdigit() and len(token) > 1:
            # TeX reads a single digit here; the rest of the number stays in the stream.
            self.tokens[self.index] = token[1:]
            return sympy.Integer(token[0])
        return self.atom()

    def atom(self) -> Any:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return sympy.Rational(token)
        if token.isalpha():
            return sympy.Symbol(token)
        if token in ("(", "{"):
            value = self.sum()
            self.take(")" if token == "(" else "}")
            return value
        if token == r"\pi":
            return sympy.pi
        if token == r"\frac":
            numerator = self.argument()
            return numerator / self.argument()
        if token == r"\sqrt":
            index = sympy.Integer(2)
            if self.peek() == "[":
                self.take()
                index = self.sum()
                self.take("]")
            return sympy.Pow(self.argument(), 1 / index, evaluate=False)
        raise LatexError(f"unsupported {token!r}")


def to_sympy(text: str) -> Any:
    """The sympy expression of a normalised LaTeX answer (no spaces, no ``\\left``/``\\right``)."""
    tokens = _tokenize(text)
    if not tokens:
        raise LatexError("empty expression")
    return _Parser(tokens).parse()
