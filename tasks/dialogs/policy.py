"""What the dialog world asks of an eviction method, in tensors only (the harness adapts a method).

The world is one attention layer; ``n`` dialogs run side by side as ``n`` rows (one query head
each). The first turn is the prompt; after it the world advances a whole turn at a time (the
paper's Algorithm 1 takes a turn's queries and new keys at once), or one token at a time::

    policy.start(n, prompt_len, new_tokens, budget, seed)
    policy.prefill(keys, values, queries, scaling, embeddings)   # the prompt's entries and queries
    per step (a turn of Q tokens, or one token, Q = 1):
        policy.next_step(Q)                          # the step's tokens join the cache
        policy.bias()                                # (n, T) additive logit bias, or None
        policy.step(keys, values, weights, queries, scaling, embeddings)   # weights only if wants_weights()
    policy.positions                                 # (n, T) positions cached, after each call
    policy.probes()                                  # per-dialog quantities the method reports

Keys, values and embeddings are ``(n, T, d)`` over ``policy.positions`` (embeddings: the tokens'
own vectors, before the head's projections); weights ``(n, Q, T)``, the causal softmax of the
step's queries ``(n, Q, d)``. ``method_s`` is the time spent inside the method.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class CachePolicy(Protocol):
    positions: Tensor
    method_s: float

    def start(self, n: int, prompt_len: int, new_tokens: int, budget: int, seed: int) -> None: ...

    def prefill(self, keys: Tensor, values: Tensor, queries: Tensor, scaling: float, embeddings: Tensor) -> None: ...

    def next_step(self, tokens: int) -> None: ...

    def wants_weights(self) -> bool: ...

    def bias(self) -> Tensor | None: ...

    def step(
        self, keys: Tensor, values: Tensor, weights: Tensor | None, queries: Tensor, scaling: float, embeddings: Tensor
    ) -> None: ...

    def probes(self) -> dict[str, Tensor]: ...
