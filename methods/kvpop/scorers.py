"""KVpop's scorers (KVpop, arXiv 2607.05061, Sec. 3.3 and App. A).

A scorer maps the post-RoPE key and value of a token, ``x = [k; v]`` per KV head, to a scalar
retention score ``r_hat``. Parameters are stacked over ``(layers, kv_heads)`` so one call scores
a whole model during training, and indexing the leading axis gives one layer at inference.

- ``MLPScorer``: stateless, ``r_hat = w2 . silu(W1 x + b1) + b2``.
- ``MLSTMScorer``: an mLSTM cell per KV head run over the token sequence; the score of token
  ``t`` is read out of the cell state at time ``t + delay`` with the token's own query, so a
  delayed scorer (``delay = w``) ranks a token with the context that followed it until it left
  the recent window (``delay = 0``: readout at insertion, the paper's Fig. 5 ablation). The
  readout is ``a . SiLU(h) + b`` (Eq. 11) or, for checkpoints of earlier versions, ``a . h + b``.

Every constructor default keeps the architecture earlier checkpoints were saved with (linear
decay range, linear readout); the training config names the paper's choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from methods.options import is_int, is_number, require_int

GAMMA_SPACES = ("log", "linear")
READOUTS = ("silu", "linear")

#: Finite stand-in for the stabiliser of an empty mLSTM state (``-inf`` would give NaN in ``-inf - -inf``).
EMPTY_STABILISER = -1e30


def hedgehog(x: Tensor) -> Tensor:
    """Hedgehog feature map ``[softmax(x); softmax(-x)]`` over the last axis (positive features)."""
    return torch.cat([x.softmax(-1), (-x).softmax(-1)], dim=-1)


@dataclass
class MLSTMState:
    """Stabilised mLSTM state: true ``C = exp(m) * matrix``, ``n = exp(m) * normaliser``.

    Parameters:
        matrix: ``(..., value_dim, feature_dim)``.
        normaliser: ``(..., feature_dim)``.
        stabiliser: ``(...)``, the running max of the log gate weights.
    """

    matrix: Tensor
    normaliser: Tensor
    stabiliser: Tensor

    @classmethod
    def empty(cls, batch: tuple[int, ...], value_dim: int, feature_dim: int, like: Tensor) -> MLSTMState:
        return cls(
            like.new_zeros(*batch, value_dim, feature_dim),
            like.new_zeros(*batch, feature_dim),
            like.new_full(batch, EMPTY_STABILISER),
        )


def mlstm_chunkwise(
    read: Tensor,
    keys: Tensor,
    values: Tensor,
    input_gate: Tensor,
    log_forget: Tensor,
    state: MLSTMState,
    chunk: int = 64,
) -> tuple[Tensor, MLSTMState]:
    """Run the mLSTM over ``T`` steps; exact, chunk by chunk, without a ``T x T`` matrix.

    Step ``tau`` adds ``exp(i_tau) v_tau k_tau^T`` after decaying the state by ``sigmoid(f_tau)``
    and reads ``h_tau = C_tau q_tau / max(|n_tau . q_tau|, 1)`` (no output gate), all in the
    stabilised form: ``m_tau`` is the max of the log weights of everything in the state, which
    is what the recurrent rule ``m_tau = max(log f_tau + m_{tau-1}, i_tau)`` computes.

    Shapes: ``read``/``keys`` ``(..., T, F)`` (feature-mapped), ``values`` ``(..., T, V)``,
    ``input_gate`` (pre-activation) and ``log_forget`` ``(..., T)``. Returns ``(..., T, V)``.
    """
    outputs = []
    matrix, normaliser, stabiliser = state.matrix, state.normaliser, state.stabiliser
    for start in range(0, read.shape[-2], chunk):
        q = read[..., start : start + chunk, :]
        k = keys[..., start : start + chunk, :]
        v = values[..., start : start + chunk, :]
        cumulative = log_forget[..., start : start + chunk].cumsum(-1)
        # log weight of chunk token j in the state at chunk time tau (j <= tau)
        intra = cumulative[..., :, None] - cumulative[..., None, :] + input_gate[..., None, start : start + chunk]
        causal = torch.ones(intra.shape[-2:], dtype=torch.bool, device=intra.device).tril()
        intra = intra.masked_fill(~causal, -torch.inf)
        carry = cumulative + stabiliser[..., None]
        current = torch.maximum(carry, intra.amax(-1))
        weights = (intra - current[..., None]).exp()
        carry_weight = (carry - current).exp()
        scores = (q @ k.transpose(-1, -2)) * weights
        numerator = scores @ v + carry_weight[..., None] * (q @ matrix.transpose(-1, -2))
        denominator = scores.sum(-1) + carry_weight * (q @ normaliser[..., None])[..., 0]
        outputs.append(numerator / torch.maximum(denominator.abs(), (-current).exp())[..., None])
        end_weight = weights[..., -1, :]
        matrix = carry_weight[..., -1, None, None] * matrix + (v * end_weight[..., None]).transpose(-1, -2) @ k
        normaliser = carry_weight[..., -1, None] * normaliser + (k * end_weight[..., None]).sum(-2)
        stabiliser = current[..., -1]
    return torch.cat(outputs, dim=-2), MLSTMState(matrix, normaliser, stabiliser)


def delayed(tokens: Tensor, delay: int) -> Tensor:
    """``tokens (..., T, F)`` in readout order: row ``tau`` holds token ``tau - delay`` (zeros before the first)."""
    if delay == 0:
        return tokens
    return torch.cat([tokens.new_zeros(*tokens.shape[:-2], delay, tokens.shape[-1]), tokens[..., :-delay, :]], -2)


def stacked(*shape: int, scale: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * scale)


class KVpopScorer(nn.Module):
    """Base: input standardisation, per-head decay ``gamma_h`` and the stacked ``(layers, heads)`` layout.

    Parameters:
        layers, kv_heads, head_dim: geometry of the model the scorer serves.
        gamma_min, gamma_max: range of the learned per-head decay, kept inside by construction.
        gamma_space: ``log`` maps ``sigmoid(theta_h)`` into ``[log gamma_min, log gamma_max]`` with
            ``0 < gamma_min < gamma_max < 1`` (Eq. 21); ``linear`` (earlier checkpoints) into
            ``[gamma_min, gamma_max]``, ``gamma_max = 1`` allowed.
    """

    kind = "base"

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        gamma_min: float,
        gamma_max: float,
        gamma_space: str = "linear",
    ) -> None:
        super().__init__()
        if gamma_space not in GAMMA_SPACES:
            raise ValueError(f"kvpop.gamma_space={gamma_space!r} is not a decay range — use log (Eq. 21) or linear")
        numbers = is_number(gamma_min) and is_number(gamma_max)
        if gamma_space == "log" and not (numbers and 0.0 < gamma_min < gamma_max < 1.0):
            raise ValueError(
                f"kvpop.gamma_min={gamma_min!r} and kvpop.gamma_max={gamma_max!r} must be numbers with "
                "0 < gamma_min < gamma_max < 1 for kvpop.gamma_space=log — use e.g. kvpop.gamma_min=0.99 "
                "kvpop.gamma_max=0.9999"
            )
        if gamma_space == "linear" and not (numbers and 0.0 < gamma_min <= gamma_max <= 1.0):
            raise ValueError(
                f"kvpop.gamma_min={gamma_min!r} and kvpop.gamma_max={gamma_max!r} must be numbers with "
                "0 < gamma_min <= gamma_max <= 1 — use e.g. kvpop.gamma_min=0.99 kvpop.gamma_max=1.0"
            )
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.gamma_min, self.gamma_max, self.gamma_space = gamma_min, gamma_max, gamma_space
        self.gamma_logit = nn.Parameter(torch.zeros(layers, kv_heads))
        # Keys and values differ in scale by layer and head (RoPE outliers): standardise per head.
        self.register_buffer("input_mean", torch.zeros(layers, kv_heads, 2 * head_dim))
        self.register_buffer("input_std", torch.ones(layers, kv_heads, 2 * head_dim))

    def log_gamma(self) -> Tensor:
        """``log gamma_h``, ``(layers, kv_heads)``, in ``[log gamma_min, log gamma_max]``."""
        share = self.gamma_logit.sigmoid()
        if self.gamma_space == "log":
            low, high = math.log(self.gamma_min), math.log(self.gamma_max)
            return low + share * (high - low)
        return (self.gamma_min + (self.gamma_max - self.gamma_min) * share).log()

    def set_input_stats(self, features: Tensor) -> None:
        """Standardisation from ``features`` ``(layers, kv_heads, N, 2 * head_dim)``."""
        self.input_mean.copy_(features.mean(-2))
        self.input_std.copy_(features.std(-2).clamp_min(1e-4))

    def inputs(self, keys: Tensor, values: Tensor, layer: int | None) -> Tensor:
        """Standardised, detached ``[k; v]``: ``(..., heads, T, 2 * head_dim)``."""
        index = slice(None) if layer is None else layer
        x = torch.cat([keys, values], dim=-1).detach().to(self.input_mean.dtype)
        return (x - self.input_mean[index][..., None, :]) / self.input_std[index][..., None, :]

    def state_numel(self) -> int:
        """Numbers of recurrent state one KV head holds while decoding (0: stateless)."""
        return 0

    def hyperparameters(self) -> dict[str, float | int | bool | str]:
        return {
            "kind": self.kind,
            "gamma_min": self.gamma_min,
            "gamma_max": self.gamma_max,
            "gamma_space": self.gamma_space,
        }


class MLPScorer(KVpopScorer):
    """Stateless KVpop scorer: a 2-layer SiLU MLP on ``[k; v]`` per KV head.

    Parameters (besides ``KVpopScorer``'s):
        hidden: hidden width.
    """

    kind = "mlp"

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        gamma_min: float,
        gamma_max: float,
        hidden: int,
        gamma_space: str = "linear",
    ) -> None:
        super().__init__(layers, kv_heads, head_dim, gamma_min, gamma_max, gamma_space)
        require_int("kvpop.hidden", hidden, minimum=1, example=32)
        self.hidden = hidden
        width = 2 * head_dim
        self.w1 = stacked(layers, kv_heads, width, hidden, scale=width**-0.5)
        self.b1 = nn.Parameter(torch.zeros(layers, kv_heads, hidden))
        self.w2 = stacked(layers, kv_heads, hidden, scale=hidden**-0.5)
        self.b2 = nn.Parameter(torch.zeros(layers, kv_heads))

    def forward(self, keys: Tensor, values: Tensor, layer: int | None = None) -> Tensor:
        """Scores ``(..., heads, T)`` of the tokens of ``keys``/``values`` ``(..., heads, T, head_dim)``."""
        index = slice(None) if layer is None else layer
        x = self.inputs(keys, values, layer)
        hidden = F.silu(x @ self.w1[index] + self.b1[index][..., None, :])
        return (hidden @ self.w2[index][..., None])[..., 0] + self.b2[index][..., None]

    def hyperparameters(self) -> dict[str, float | int | bool | str]:
        return {**super().hyperparameters(), "hidden": self.hidden}


class MLSTMScorer(KVpopScorer):
    """Stateful KVpop scorer: an mLSTM per KV head over ``[k; v]``, read out with a delay (Eqs. 10-11).

    Per head, linear projections ``W_{q/k/v}`` of ``[k; v]`` to ``cell_dim`` give the cell's query,
    key and value; the Hedgehog map ``[softmax(x); softmax(-x)]`` makes query and key features
    positive (width ``2 cell_dim``); an exponential input gate (max-stabilised) and a sigmoid forget
    gate; no output gate (App. A); ``r_hat = a . SiLU(h) + b`` (``readout=silu``, Eq. 11).

    Parameters (besides ``KVpopScorer``'s):
        cell_dim: width of the cell's query/key (before the feature map) and value; the paper's
            ``d_qkv / 2`` (App. A), so the features are ``head_dim`` wide.
        delay: readout delay in tokens (the recent window ``w``: scored when leaving it); 0
            reads out at insertion.
        chunk: chunk length of the exact chunkwise form.
        readout: ``silu`` (Eq. 11) or ``linear`` (``a . h + b``, earlier checkpoints).
    """

    kind = "mlstm"

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        gamma_min: float,
        gamma_max: float,
        cell_dim: int,
        delay: int,
        chunk: int = 64,
        gamma_space: str = "linear",
        readout: str = "linear",
    ) -> None:
        super().__init__(layers, kv_heads, head_dim, gamma_min, gamma_max, gamma_space)
        if not is_int(delay) or delay < 0:
            raise ValueError(
                f"kvpop.window={delay!r}, the mLSTM readout delay, must be an integer >= 0 — use e.g. kvpop.window=32, "
                "or kvpop.delayed=false"
            )
        require_int("kvpop.cell_dim", cell_dim, minimum=1, example=16)
        require_int("kvpop.chunk", chunk, minimum=1, example=64)
        if readout not in READOUTS:
            raise ValueError(f"kvpop.readout={readout!r} is not a readout — use silu (Eq. 11) or linear")
        self.cell_dim, self.delay, self.chunk, self.readout_kind = cell_dim, delay, chunk, readout
        width = 2 * head_dim
        self.w_qkv = stacked(layers, kv_heads, width, 3 * cell_dim, scale=width**-0.5)
        self.b_qkv = nn.Parameter(torch.zeros(layers, kv_heads, 3 * cell_dim))
        self.w_gates = stacked(layers, kv_heads, width, 2, scale=0.1 * width**-0.5)
        # A forget bias of 3 (sigmoid ~ 0.95) starts the memory long, as in xLSTM.
        self.b_gates = nn.Parameter(torch.tensor([0.0, 3.0]).expand(layers, kv_heads, 2).clone())
        self.w_out = stacked(layers, kv_heads, cell_dim, scale=cell_dim**-0.5)
        self.b_out = nn.Parameter(torch.zeros(layers, kv_heads))

    def _projections(self, keys: Tensor, values: Tensor, layer: int | None) -> tuple[Tensor, Tensor]:
        index = slice(None) if layer is None else layer
        x = self.inputs(keys, values, layer)
        return x @ self.w_qkv[index] + self.b_qkv[index][..., None, :], x

    def project(self, keys: Tensor, values: Tensor, layer: int | None) -> tuple[Tensor, ...]:
        """Cell inputs of new tokens: key features, values, input gate, log forget gate."""
        index = slice(None) if layer is None else layer
        qkv, x = self._projections(keys, values, layer)
        _, k, v = qkv.split(self.cell_dim, dim=-1)
        gates = x @ self.w_gates[index] + self.b_gates[index][..., None, :]
        return hedgehog(k), v, gates[..., 0], F.logsigmoid(gates[..., 1])

    def read_features(self, keys: Tensor, values: Tensor, layer: int | None) -> Tensor:
        """Query features of the tokens being read out (recomputed from their cached ``[k; v]``)."""
        return hedgehog(self._projections(keys, values, layer)[0][..., : self.cell_dim])

    def readout(self, hidden: Tensor, layer: int | None) -> Tensor:
        index = slice(None) if layer is None else layer
        if self.readout_kind == "silu":
            hidden = F.silu(hidden)
        return (hidden @ self.w_out[index][..., None])[..., 0] + self.b_out[index][..., None]

    def empty_state(self, batch: tuple[int, ...], like: Tensor) -> MLSTMState:
        return MLSTMState.empty(batch, self.cell_dim, 2 * self.cell_dim, like)

    def state_numel(self) -> int:
        """``C`` (``cell_dim x 2 cell_dim``), the normaliser (``2 cell_dim``) and the stabiliser, per head."""
        return self.cell_dim * 2 * self.cell_dim + 2 * self.cell_dim + 1

    def step(
        self,
        keys: Tensor,
        values: Tensor,
        layer: int | None,
        state: MLSTMState | None,
        read_keys: Tensor,
        read_values: Tensor,
    ) -> tuple[Tensor, MLSTMState]:
        """Feed new tokens ``(..., heads, T, head_dim)``; at each new time read the state with the
        token of ``read_keys``/``read_values`` (same shape: the token ``delay`` positions earlier,
        taken from the cache, where the protected window still holds it).

        Returns ``(scores (..., heads, T), state)``; readouts for times before the first ``delay``
        tokens belong to no token (the caller drops them).
        """
        k, v, input_gate, log_forget = self.project(keys, values, layer)
        if state is None:
            state = self.empty_state(k.shape[:-2], k)
        read = self.read_features(read_keys, read_values, layer)
        hidden, state = mlstm_chunkwise(read, k, v, input_gate, log_forget, state, self.chunk)
        return self.readout(hidden, layer), state

    def forward(self, keys: Tensor, values: Tensor, layer: int | None = None) -> Tensor:
        """Scores ``(..., heads, T)`` of a whole sequence, token-aligned: ``r_hat[t]`` is read at
        ``t + delay`` (the last ``delay`` tokens, never read within the sequence, get 0)."""
        read_keys, read_values = delayed(keys, self.delay), delayed(values, self.delay)
        readouts, _ = self.step(keys, values, layer, None, read_keys, read_values)
        return F.pad(readouts[..., self.delay :], (0, self.delay))

    def hyperparameters(self) -> dict[str, float | int | bool | str]:
        return {
            **super().hyperparameters(),
            "cell_dim": self.cell_dim,
            "delay": self.delay,
            "chunk": self.chunk,
            "readout": self.readout_kind,
        }


SCORERS: dict[str, type[KVpopScorer]] = {"mlp": MLPScorer, "mlstm": MLSTMScorer}


def build_scorer(kind: str, layers: int, kv_heads: int, head_dim: int, **hyper: float | int | bool) -> KVpopScorer:
    """A scorer of ``kind`` (``mlp`` or ``mlstm``) for the given geometry."""
    if kind not in SCORERS:
        raise ValueError(f"kvpop.scorer={kind!r} is not a KVpop scorer — use one of {', '.join(sorted(SCORERS))}")
    return SCORERS[kind](layers, kv_heads, head_dim, **hyper)
