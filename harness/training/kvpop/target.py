"""KVpop's future-attention target, computed without an S x S matrix.

For token ``t`` and query head ``g``, ``mass_g(t) = sum_{d >= t + w} A_g[d, t]``: the causal softmax
attention it receives from queries that come after it left a recent window of ``w``. Per KV head
the target is ``log(eps + max_g mass_g(t) / N_t)`` over the head's query group, with ``N_t = S - t - w``
the number of such queries (count normalisation: a late token has fewer future queries to collect
mass from). Tokens with ``N_t = 0`` get no target (``valid`` is False).

The sum runs over the *query* axis of the attention, a transposed pass: first the log-sum-exp of
every query row (blockwise), then per key block the sum of ``exp(s - lse_d)`` over query blocks.
``flex`` runs the same transposed pass through FlexAttention, whose log-sum-exp output over the
(masked) query axis is ``log mass`` directly.

The normalisers of the first pass are the dense causal ones (Eq. 8, exact). KVpop's training
(Sec. 3.2, Eq. 9) reuses instead the log-normalisers of the student's sparse attention, which the
sparse pass computes anyway; ``lse`` takes those.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.kvpop.recall import target_from_mass

METHODS = ("chunked", "flex", "dense")


def row_logsumexp(queries: Tensor, keys: Tensor, scaling: float, block: int) -> Tensor:
    """Causal log-sum-exp of every query row, ``(H, S)``, one ``block x block`` tile at a time.

    ``queries`` ``(H, S, D)`` and ``keys`` ``(H, S, D)`` (keys already repeated to the query heads).
    """
    heads, length, _ = queries.shape
    out = queries.new_empty(heads, length)
    for q0 in range(0, length, block):
        q = queries[:, q0 : q0 + block]
        rows = torch.arange(q0, q0 + q.shape[1], device=q.device)
        total = q.new_full((heads, q.shape[1]), -torch.inf)
        for k0 in range(0, q0 + q.shape[1], block):
            logits = (q @ keys[:, k0 : k0 + block].transpose(-1, -2)) * scaling
            cols = torch.arange(k0, k0 + logits.shape[-1], device=q.device)
            logits = logits.masked_fill(cols[None, :] > rows[:, None], -torch.inf)
            total = torch.logaddexp(total, logits.logsumexp(-1))
        out[:, q0 : q0 + q.shape[1]] = total
    return out


def future_mass_chunked(
    queries: Tensor, keys: Tensor, scaling: float, window: int, block: int = 256, lse: Tensor | None = None
) -> Tensor:
    """``mass_g(t)`` ``(H, S)`` for every query head, by the exact two-pass blockwise method."""
    heads, length, _ = queries.shape
    lse = row_logsumexp(queries, keys, scaling, block) if lse is None else lse
    mass = queries.new_zeros(heads, length)
    for k0 in range(0, length, block):
        k = keys[:, k0 : k0 + block]
        cols = torch.arange(k0, k0 + k.shape[1], device=k.device)
        # Only queries d >= t + w of the block's first key can contribute.
        for q0 in range((k0 + window) // block * block, length, block):
            logits = (queries[:, q0 : q0 + block] @ k.transpose(-1, -2)) * scaling
            rows = torch.arange(q0, q0 + logits.shape[1], device=k.device)
            weights = (logits - lse[:, q0 : q0 + block, None]).exp()
            weights = weights.masked_fill(rows[:, None] < cols[None, :] + window, 0.0)
            mass[:, k0 : k0 + k.shape[1]] += weights.sum(1)
    return mass


def future_mass_flex(queries: Tensor, keys: Tensor, scaling: float, window: int, lse: Tensor | None = None) -> Tensor:
    """``mass_g(t)`` ``(H, S)`` through FlexAttention (compiled where the platform supports it).

    Pass 1 is ordinary causal attention with ``return_lse``; pass 2 swaps roles (keys attend to
    queries) with ``score_mod`` subtracting each query's log-sum-exp and a mask ``d >= t + w``:
    its log-sum-exp is ``log sum_d exp(s_dt - lse_d) = log mass``.
    """
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    heads, length, dim = queries.shape
    q, k = queries[None], keys[None]
    ones = q.new_ones(1, heads, length, dim)

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx

    def future(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx >= q_idx + window

    device = str(q.device)
    attend = torch.compile(flex_attention) if flex_supported(q.device) else flex_attention
    if lse is None:
        mask = create_block_mask(causal, None, None, length, length, device=device)
        _, aux = attend(q, k, ones, block_mask=mask, scale=scaling, return_aux=AuxRequest(lse=True))
        lse = aux.lse.float()
    else:
        lse = lse[None].float()

    def minus_lse(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - lse[b, h, kv_idx]

    mask = create_block_mask(future, None, None, length, length, device=device)
    _, aux = attend(k, q, ones, score_mod=minus_lse, block_mask=mask, scale=scaling, return_aux=AuxRequest(lse=True))
    return aux.lse[0].float().exp().nan_to_num(0.0)


def future_mass_dense(queries: Tensor, keys: Tensor, scaling: float, window: int, lse: Tensor | None = None) -> Tensor:
    """Reference: the full ``S x S`` attention, summed over masked query rows (small S only)."""
    length = queries.shape[1]
    logits = (queries @ keys.transpose(-1, -2)) * scaling
    index = torch.arange(length, device=queries.device)
    logits = logits.masked_fill(index[None, :] > index[:, None], -torch.inf)
    attention = logits.softmax(-1) if lse is None else (logits - lse[..., None]).exp()
    return attention.masked_fill(index[:, None] < index[None, :] + window, 0.0).sum(1)


def flex_supported(device: torch.device) -> bool:
    """FlexAttention is compiled (fast, no S x S matrix) on CUDA; on CPU torch falls back to an
    eager path that materialises the scores, so the chunked path is used there."""
    return device.type == "cuda"


def future_attention_target(
    queries: Tensor,
    keys: Tensor,
    scaling: float,
    window: int,
    eps: float = 1e-6,
    method: str = "auto",
    block: int = 256,
    lse: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-KV-head target ``(Hkv, S)`` and its validity mask ``(S,)`` for one layer and sequence.

    Parameters:
        queries: ``(H, S, D)`` post-RoPE queries; keys: ``(Hkv, S, D)`` post-RoPE keys (GQA).
        scaling: the model's softmax scale.
        window: ``w``; mass counts from queries ``d >= t + w``.
        eps: floor inside the log.
        method: ``chunked``, ``flex``, ``dense`` or ``auto`` (flex where supported, else chunked).
        lse: ``(H, S)`` per-query log-normalisers to use instead of the dense causal ones (Eq. 9).
    """
    if method == "auto":
        method = "flex" if flex_supported(queries.device) else "chunked"
    if method not in METHODS:
        raise ValueError(f"target method {method!r} is not one of {METHODS} or 'auto'")
    heads, length, _ = queries.shape
    kv_heads = keys.shape[0]
    repeated = keys.repeat_interleave(heads // kv_heads, dim=0)
    # bf16/fp16 activations are summed in fp32 at least
    dtype = torch.promote_types(queries.dtype, torch.float32)
    queries, repeated = queries.to(dtype), repeated.to(dtype)
    lse = None if lse is None else lse.to(dtype)
    if method == "chunked":
        mass = future_mass_chunked(queries, repeated, scaling, window, block, lse)
    elif method == "flex":
        mass = future_mass_flex(queries, repeated, scaling, window, lse)
    else:
        mass = future_mass_dense(queries, repeated, scaling, window, lse)
    return target_from_mass(mass.view(kv_heads, heads // kv_heads, length), window, eps)
