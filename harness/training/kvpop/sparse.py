"""Training-time attention under an eviction pattern, the whole sequence in one forward (KVpop, App. C).

While decoding, the cache holds only the kept entries; in training one parallel mask over the
sequence reproduces what every query sees: the sinks, the window ``[q - w, q]`` and the ``k`` best
of ``[s, q - 1 - w]`` (the engine's cache after step ``q - 1``, plus the new token). KVpop ranks by
the scorer's static priorities (``methods.kvpop.ranking.drop_times``); StreamingLLM+ keeps the
``w + k + 1`` most recent instead; DMS adds the soft bias ``log(1 - alpha_t)`` to tokens past the
window (its relaxed gates). ``dense`` builds the ``S x S`` pattern per KV head (CPU, short
sequences); ``flex`` evaluates the same predicate inside FlexAttention (CUDA, no ``S x S`` matrix).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.decode.attention import AttentionCall
from methods.kvpop.ranking import drop_times, kept_mask

ATTENTIONS = ("auto", "dense", "flex")


def resolve_attention(kind: str, device: torch.device) -> str:
    """``auto``: FlexAttention where it compiles (CUDA), else the dense pattern."""
    if kind not in ATTENTIONS:
        raise ValueError(f"train.attention={kind!r} is not an attention path — use one of {', '.join(ATTENTIONS)}")
    if kind == "auto":
        return "flex" if device.type == "cuda" else "dense"
    return kind


def kvpop_mask(priority: Tensor, sinks: int, window: int, k: int) -> Tensor:
    """``(rows, S, S)`` boolean attention pattern of the KVpop policy for static ``priority`` ``(rows, S)``."""
    return kept_mask(drop_times(priority, sinks, window, k), sinks, window)


def streaming_drop(rows: int, length: int, window: int, k: int, device: torch.device) -> Tensor:
    """StreamingLLM+'s pattern as drop times: a token leaves when it falls out of the ``w + k + 1`` latest."""
    drop = torch.arange(length, device=device) + 1 + window + k
    return drop.clamp_max(length).expand(rows, -1)


def streaming_mask(length: int, sinks: int, window: int, k: int) -> Tensor:
    """``(S, S)`` StreamingLLM+ pattern with the same budget: sinks and the ``w + k + 1`` latest tokens."""
    return kept_mask(streaming_drop(1, length, window, k, torch.device("cpu")), sinks, window)[0]


def _flex(call: AttentionCall, mask_mod, score_mod=None) -> tuple[Tensor, Tensor]:
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    length = call.query.shape[2]
    attend = torch.compile(flex_attention) if call.query.device.type == "cuda" else flex_attention
    mask = create_block_mask(mask_mod, None, None, length, length, device=str(call.query.device))
    output, aux = attend(
        call.query,
        call.key,
        call.value,
        score_mod=score_mod,
        block_mask=mask,
        scale=call.scaling,
        enable_gqa=True,
        return_aux=AuxRequest(lse=True),
    )
    return output.transpose(1, 2).contiguous(), aux.lse[0].float()


def attend_kept(call: AttentionCall, drop: Tensor, sinks: int, window: int, kind: str) -> tuple[Tensor, Tensor]:
    """Attention where query ``q`` sees the sinks, its window and the candidates with ``q < drop``.

    ``drop`` ``(kv_heads or 1, S)``. Returns the output ``(1, S, H, D)`` and the sparse
    log-normalisers ``(H, S)`` (detached), which the future-attention target reuses (Eq. 9).
    """
    group = call.query.shape[1] // drop.shape[0] if drop.shape[0] > 1 else call.query.shape[1]
    if kind == "flex":

        def kept(b: Tensor, h: Tensor, q: Tensor, t: Tensor) -> Tensor:
            candidate = (t >= sinks) & (t <= q - 1 - window) & (q < drop[h // group, t])
            return (t <= q) & ((t < sinks) | (t >= q - window) | candidate)

        output, lse = _flex(call, kept)
        return output, lse.detach()
    mask = kept_mask(drop, sinks, window).to(call.query.device).repeat_interleave(group, dim=0)
    heads = call.query.shape[1]
    key = call.key.repeat_interleave(heads // call.key.shape[1], dim=1)
    value = call.value.repeat_interleave(heads // call.value.shape[1], dim=1)
    # One explicit pass gives the output and the log-normalisers together.
    logits = ((call.query @ key.transpose(-1, -2)) * call.scaling).float().masked_fill(~mask[None], -torch.inf)
    lse = logits.logsumexp(-1, keepdim=True)
    output = (logits - lse).exp().to(call.query.dtype) @ value
    return output.transpose(1, 2).contiguous(), lse[0, ..., 0].detach()


def attend_soft(call: AttentionCall, log_keep: Tensor, sinks: int, window: int, kind: str) -> Tensor:
    """Causal attention with ``log_keep[h, t]`` added for keys past the window (DMS's relaxed eviction).

    ``log_keep`` ``(kv_heads, S)`` is ``log(1 - alpha_t)``; gradients reach it through the bias.
    Returns the output ``(1, S, H, D)``.
    """
    heads, length = call.query.shape[1], call.query.shape[2]
    group = heads // log_keep.shape[0]
    if kind == "flex":

        def causal(b: Tensor, h: Tensor, q: Tensor, t: Tensor) -> Tensor:
            return t <= q

        def bias(score: Tensor, b: Tensor, h: Tensor, q: Tensor, t: Tensor) -> Tensor:
            past = (t >= sinks) & (t <= q - 1 - window)
            return score + torch.where(past, log_keep[h // group, t], 0.0)

        return _flex(call, causal, bias)[0]
    index = torch.arange(length, device=call.query.device)
    past = (index[None, :] >= sinks) & (index[None, :] <= index[:, None] - 1 - window)
    extra = torch.where(past[None], log_keep[:, None, :], 0.0).repeat_interleave(group, dim=0)
    extra = extra.masked_fill(index[None, :] > index[:, None], -torch.inf)
    key = call.key.repeat_interleave(heads // call.key.shape[1], dim=1)
    value = call.value.repeat_interleave(heads // call.value.shape[1], dim=1)
    logits = (call.query @ key.transpose(-1, -2)) * call.scaling + extra[None].to(call.query.dtype)
    output = logits.float().softmax(-1).to(call.query.dtype) @ value
    return output.transpose(1, 2).contiguous()
