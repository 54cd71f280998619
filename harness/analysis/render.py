"""Rendering a table (a header and rows of strings) as Markdown and as a LaTeX booktabs table."""

from __future__ import annotations


def to_markdown(header: list[str], body: list[list[str]]) -> str:
    """A GitHub Markdown table (pipes inside cells escaped)."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join(["---"] * len(header)) + "|", *(line(r) for r in body)])


_LATEX_SPECIAL = {c: f"\\{c}" for c in "&%$#_{}"}
_LATEX_UNICODE = {
    "ρ": r"$\rho$",
    "α": r"$\alpha$",
    "γ": r"$\gamma$",
    "Δ": r"$\Delta$",
    "µ": r"$\mu$",
    "·": r"$\cdot$",
    "≥": r"$\geq$",
    "—": "--",
}


def latex_escape(text: str) -> str:
    """``text`` safe inside a LaTeX table cell (pdflatex: Greek letters become math)."""
    out = text.replace("\\", r"\textbackslash{}")
    for char, escaped in _LATEX_SPECIAL.items():
        out = out.replace(char, escaped)
    out = out.replace("~", r"\textasciitilde{}").replace("^", r"\textasciicircum{}").replace("<", r"\textless{}")
    for char, math_mode in _LATEX_UNICODE.items():
        out = out.replace(char, math_mode)
    return out


def to_latex(header: list[str], body: list[list[str]], caption: str, label: str) -> str:
    """A booktabs ``table`` environment."""
    row = lambda cells: " & ".join(latex_escape(c) for c in cells) + r" \\"  # noqa: E731
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(caption)}}}",
            rf"\label{{tab:{label}}}",
            r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
            r"\toprule",
            row(header),
            r"\midrule",
            *(row(r) for r in body),
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
            "",
        ]
    )
