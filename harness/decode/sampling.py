"""Next-token choice: greedy, or temperature / top-k / top-p sampling under a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.options import is_int, is_number


@dataclass
class Sampling:
    """Decoding parameters.

    Parameters:
        temperature: 0 for greedy decoding (the default: eviction comparisons are paired).
        top_k: keep the k most likely tokens (0: all).
        top_p: nucleus mass (1.0: all).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (is_number(self.temperature) and self.temperature >= 0):
            raise ValueError(
                f"sampling.temperature={self.temperature!r} is not a finite number >= 0 — use 0 (greedy) or e.g. 0.6"
            )
        if not (is_int(self.top_k) and self.top_k >= 0):
            raise ValueError(f"sampling.top_k={self.top_k!r} is not an integer >= 0 — use 0 (no limit) or e.g. 50")
        if not (is_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"sampling.top_p={self.top_p!r} is outside (0, 1] — use 1.0 (no limit) or e.g. 0.95")

    def choose(self, logits: Tensor, generator: torch.Generator | None) -> int:
        """Pick the next token from one row of logits (its id on the host)."""
        return int(self.next_token(logits, generator))

    def next_token(self, logits: Tensor, generator: torch.Generator | None) -> Tensor:
        """Pick the next token from one row of logits, on their device: a 0-dim id nothing waits for."""
        if self.temperature == 0.0:
            return logits.argmax()
        scores = logits.float() / self.temperature
        if self.top_k:
            threshold = scores.topk(min(self.top_k, scores.numel())).values[-1]
            scores = scores.masked_fill(scores < threshold, -torch.inf)
        if self.top_p < 1.0:
            ordered, order = scores.sort(descending=True)
            mass = ordered.softmax(-1).cumsum(-1)
            # Drop a token once the mass before it already reaches top_p; the first always stays.
            drop = (mass - ordered.softmax(-1)) >= self.top_p
            scores = scores.scatter(0, order, ordered.masked_fill(drop, -torch.inf))
        # ``generator`` lives on the logits' device: no copy to the host before the draw.
        return torch.multinomial(scores.softmax(-1), 1, generator=generator)[0]
