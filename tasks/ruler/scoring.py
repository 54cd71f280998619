"""RULER's metrics (``scripts/eval/synthetic/constants.py``, ``scripts/eval/evaluate.py``).

The same at NVIDIA/RULER 533f013 and in NVIDIA's package (RULER c5341b4): ``scripts/ruler_peer_check.py``
runs the package's ``evaluate.py`` on the predictions it scores here and finds every per-sample
score equal. RULER averages over a subtask and rounds the mean to two decimals; here each
function scores one prediction on the same 0-100 scale and leaves averaging to the harness.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's prediction cleanup: control characters become newlines, ends are stripped."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Percent of references found (case-insensitively) in the prediction."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    text = postprocess(prediction).lower()
    return 100.0 * sum(ref.lower() in text for ref in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """100 if any reference is found (case-insensitively) in the prediction, else 0."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    text = postprocess(prediction).lower()
    return 100.0 if any(ref.lower() in text for ref in references) else 0.0
