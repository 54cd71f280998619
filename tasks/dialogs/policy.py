"""What the dialog world asks of an eviction method, in tensors only (the harness adapts a method).

The world is one attention layer; ``n`` dialogs run side by side as ``n`` rows (one query head
each). The first turn is the prompt, every later token one decode step::

    policy.start(n, prompt_len, new_tokens, budget, seed)
    policy.prefill(keys, values, queries, scaling)    # the prompt's keys, values and queries
    per decode step:
        policy.next_step()                          # the new token joins the cache
        policy.bias()                               # (n, T) additive logit bias, or None
        policy.step(keys, values, weights, query, scaling)   # weights only if wants_weights()
    policy.positions                                # (n, T) positions cached, after each call

Keys, values and weights are ``(n, T, d)`` / ``(n, 1, T)`` over ``policy.positions``; queries
``(n, Q, d)``. ``method_s`` is the time spent inside the method.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class CachePolicy(Protocol):
    positions: Tensor
    method_s: float

    def start(self, n: int, prompt_len: int, new_tokens: int, budget: int, seed: int) -> None: ...

    def prefill(self, keys: Tensor, values: Tensor, queries: Tensor, scaling: float) -> None: ...

    def next_step(self) -> None: ...

    def wants_weights(self) -> bool: ...

    def bias(self) -> Tensor | None: ...

    def step(self, keys: Tensor, values: Tensor, weights: Tensor | None, query: Tensor, scaling: float) -> None: ...
