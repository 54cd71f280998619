"""AIME/HMMT answers: \\boxed{} extraction, LaTeX normalisation, numeric and symbolic equivalence."""

from __future__ import annotations

import time

import pytest
import sympy

from tasks.math import answers
from tasks.math.answers import extract_answer, is_equivalent, last_boxed, normalize
from tasks.math.latex import LatexError, to_sympy


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} done", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{3}, then corrected: \boxed{5}", "5"),
        (r"\fbox{42}", "42"),
        (r"$\boxed 7$", "7"),
        (r"\boxed {12}", "12"),
        (r"\boxed{}", ""),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        # The final box is cut off by the token limit: the latest complete box counts.
        (r"\boxed{4} so far ... \boxed{\frac{1}{", "4"),
        ("no box here", None),
        ("", None),
        (r"\boxedx{3}", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_extract_answer_falls_back_to_answer_phrase_not_last_number() -> None:
    assert extract_answer(r"Thus \boxed{33}.") == ("33", True)
    assert extract_answer("We get 12, so the answer is 33.") == ("33", False)
    assert extract_answer(r"Final Answer: $\frac{1}{2}$.") == (r"\frac{1}{2}", False)
    assert extract_answer("The sum is 12 and the product 35") == (None, False)
    assert extract_answer("") == (None, False)
    assert extract_answer("The answer is ") == (None, False)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (r"\$33\$", "33"),
        ("33.", "33"),
        (r"$\left( 1, 2 \right)$", "(1,2)"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac 1 2", r"\frac12"),
        (r"45^{\circ}", "45"),
        ("45°", "45"),
        (r"30\%", "30"),
        (r"5\text{ cm}^2", "5"),
        (r"12 \text{ square units}", "12"),
        (r"x = 3", "3"),
        (r"1\,000", "1000"),
        ("1,000,000", "1000000"),
        (r"2\!\sqrt{3}", r"2\sqrt{3}"),
        ("degrees", "degrees"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("033", "33"),
        ("33", "033"),
        (r"\$33\$", "33"),
        ("33.", "33"),
        ("0", "000"),
        (r"\frac{1}{2}", "0.5"),
        ("1/2", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", r"\frac12"),
        (r"\tfrac{3}{6}", "0.5"),
        (r"\sqrt{12}", r"2\sqrt{3}"),
        (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"),
        (r"\sqrt[3]{8}", "2"),
        (r"\frac{\pi}{3}", r"\pi/3"),
        (r"\frac{2\pi}{6}", r"\frac{\pi}{3}"),
        (r"4\pi - 2", r"-2+4\pi"),
        ("-7/4", r"-\frac{7}{4}"),
        (r"-\frac{7}{4}", "-1.75"),
        (r"\left(\frac{1}{2}\right)^{2}", r"\frac{1}{4}"),
        (r"2^{10}", "1024"),
        (r"3 \cdot 5", "15"),
        (r"60^\circ", "60"),
        (r"60 \text{ degrees}", "60"),
        (r"12\text{ cm}", "12"),
        ("x=5", "5"),
        ("(1, 2)", r"\left(1,\frac{4}{2}\right)"),
        (r"x^2 + 2x + 1", r"(x+1)^2"),
        (r"\frac{a}{2}", "0.5a"),
    ],
)
def test_equivalent(prediction: str, gold: str) -> None:
    assert is_equivalent(prediction, gold)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("34", "33"),
        ("330", "33"),
        ("3.3", "33"),
        ("-33", "33"),
        ("0.33", r"\frac{1}{3}"),
        ("0.51", r"\frac{1}{2}"),
        (r"3\sqrt{2}", r"2\sqrt{3}"),
        (r"\sqrt{3}", r"\sqrt{2}"),
        (r"\frac{\pi}{4}", r"\frac{\pi}{3}"),
        ("3.14", r"\pi"),
        ("7/4", r"-\frac{7}{4}"),
        ("(2, 1)", "(1, 2)"),
        ("(1, 2, 3)", "(1, 2)"),
        ("x + 1", "x + 2"),
        ("", "33"),
        (None, "33"),
        (r"\frac{1}{0}", r"\frac{1}{0}1"),
        ("degrees", "60"),
    ],
)
def test_not_equivalent(prediction: str | None, gold: str) -> None:
    assert not is_equivalent(prediction, gold)


def test_huge_powers_compare_without_computing_them() -> None:
    assert is_equivalent(r"10^{10^{10}}", r"10^{10^{10}}+0")
    assert not is_equivalent(r"10^{10^{10}}", r"10^{10^{10}}+10^{10^{10}}")


def test_unparseable_answers_compare_as_strings() -> None:
    assert is_equivalent(r"\text{Alice}", "Alice")
    assert not is_equivalent(r"\binom{5}{2}", "10")
    with pytest.raises(LatexError):
        to_sympy(r"\binom{5}{2}")


def test_latex_conversion() -> None:
    assert to_sympy(r"\frac12") == to_sympy("0.5")
    assert str(to_sympy(r"x^23")) == "3*x**2"
    assert to_sympy(r"2^-1").evalf() == 0.5


def test_symbolic_comparison_gives_up_at_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(expression):
        time.sleep(5)
        return expression

    monkeypatch.setattr(answers, "SYMPY_SECONDS", 0.1)
    monkeypatch.setattr(sympy, "simplify", slow)
    start = time.perf_counter()
    assert not is_equivalent("x^2 + 2x + 1", "(x+1)^2")
    assert time.perf_counter() - start < 2
