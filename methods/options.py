"""Checks of numeric method options, refused in one line that names the option as the user writes it.

Hydra hands over whatever the command line said (``method.refresh_every=abc`` is the string
``'abc'``), so a type check comes before any comparison that would raise a ``TypeError``.
"""

from __future__ import annotations


def is_number(value: object) -> bool:
    """An int or a float, not a bool (``true`` on the command line is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    """An int, not a bool (Python's bool is an int, but ``true`` on the command line is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(option: str, value: object, minimum: int, example: int) -> None:
    """Refuse ``option=value`` unless it is an integer >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{option}={value!r} must be an integer >= {minimum} — use e.g. {option}={example}")


def require_number(
    option: str, value: object, example: float, minimum: float, maximum: float | None = None, open_max: bool = False
) -> None:
    """Refuse ``option=value`` unless it is a number >= ``minimum`` and <= ``maximum`` (< with ``open_max``)."""
    if (
        is_number(value)
        and value >= minimum
        and (maximum is None or value < maximum or (value == maximum and not open_max))
    ):
        return
    if maximum is None:
        allowed = f"a number >= {minimum:g}"
    else:
        allowed = f"a number in [{minimum:g}, {maximum:g}{')' if open_max else ']'}"
    raise ValueError(f"{option}={value!r} must be {allowed} — use e.g. {option}={example:g}")
