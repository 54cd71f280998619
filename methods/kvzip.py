"""KVzip (Kim et al. 2025, arXiv:2505.23416): query-agnostic eviction by what reconstructing the context needs.

After the prefill the model reads the prompt again, chunk by chunk, after an instruction to repeat
it (``methods.base.Reconstruction``; the harness runs the passes inside ``prefill_s``). An
entry's score, per KV head, is the largest attention any query of its group pays it while its
chunk is reconstructed; as in kvpress's ``KVzipPress``, each chunk's queries attend to the
sinks, the chunk's own prompt entries and the pass's earlier entries only. The prompt keeps
``L * H * B`` entries in all: the best over every layer and head (``layerwise=false``, the
default) or ``H * B`` per layer, so per-head counts differ.

``mode=evict`` removes the others from memory (a ragged cache); ``mode=mask`` is the released
kvpress mode the InertiaKV paper measured: every entry stays in memory and attention skips the
masked ones (a -inf logit bias), so ``kv_bytes_final`` stays near the full cache while
``kv_entries_final`` counts what attention sees. The cache then grows by the generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from methods.allocation import pooled_keep
from methods.base import EvictionMethod, KeepPlan, LayerView, Reconstruction, SequenceInfo
from methods.options import require_int
from methods.selection import Selection

MODES = ("evict", "mask")


@dataclass
class KVzip(EvictionMethod):
    """Score every prompt entry by context reconstruction, keep the best physically or by mask.

    Parameters:
        selection: budget B (per layer and KV head on average), sinks always kept (kvpress: 4),
            granularity ``head``.
        mode: ``evict`` (physically) or ``mask`` (kept in memory, hidden from attention).
        layerwise: the same number of entries in every layer (``H * B``) instead of one pool.
        chunk: prompt tokens reconstructed per pass (kvpress: 2048).
        overlap: tokens of the previous chunk repeated after the later instruction (kvpress: 8).
        first, later: the repeat instructions (kvpress's).
        name: label for records and tables.
    """

    selection: Selection
    mode: str = "evict"
    layerwise: bool = False
    chunk: int = 2048
    overlap: int = 8
    first: str = "\n\nRepeat the previous context exactly."
    later: str = "\n\nRepeat the part of the previous context exactly, starting with"
    name: str = "kvzip"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"method.mode={self.mode!r} is not a KVzip mode — use evict (physically) or mask (kvpress's released"
                " masking mode)"
            )
        if self.selection.granularity != "head":
            raise ValueError(
                f"method.selection.granularity={self.selection.granularity!r} does not suit KVzip, which keeps entries"
                " per KV head — use method.selection.granularity=head"
            )
        require_int("method.chunk", self.chunk, minimum=1, example=2048)
        require_int("method.overlap", self.overlap, minimum=0, example=8)

    def check(self, info: SequenceInfo) -> int | None:
        return self.selection.budget_for(info.prefill_len)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self.scores = torch.zeros(info.num_layers, info.num_kv_heads, info.prefill_len, device=info.device)
        self._hidden: list[Tensor] | None = None

    def budget(self) -> int | None:
        return self._budget

    def _evicts(self) -> bool:
        return self._budget is not None and self._budget < self.info.prefill_len

    def reconstruction(self) -> Reconstruction | None:
        return Reconstruction(self.chunk, self.first, self.later, self.overlap) if self._evicts() else None

    def observe_reconstruction(self, view: LayerView, start: int, end: int) -> None:
        prompt = self.info.prefill_len
        kv_heads, _, dim = view.keys.shape
        sinks = min(self.selection.sinks, start)
        keys = torch.cat([view.keys[:, :sinks], view.keys[:, start:end], view.keys[:, prompt:]], dim=1).float()
        queries = view.queries.float()
        count = queries.shape[1]
        grouped = queries.view(kv_heads, -1, count, dim)
        logits = torch.matmul(grouped, keys.transpose(-1, -2)[:, None]) * view.scaling
        own = torch.ones(count, count, dtype=torch.bool, device=logits.device).triu(1)
        logits[..., -count:] = logits[..., -count:].masked_fill(own, -torch.inf)
        weights = logits.softmax(dim=-1)[..., sinks : sinks + end - start]
        self.scores[view.layer, :, start:end] = weights.amax(dim=(1, 2))

    def keep(self, step: int, positions: list[Tensor]) -> KeepPlan | None:
        if step != 0 or not self._evicts():
            return None
        prompt = self.info.prefill_len
        rows = []
        for layer, layer_positions in enumerate(positions):
            protected = self.selection.protected(layer_positions, prompt, self._budget)
            rows.extend(self.scores[layer].masked_fill(protected, torch.inf).unbind(0))
        heads = self.info.num_kv_heads
        if self.layerwise:
            plan = [pooled_keep(rows[i : i + heads], heads * self._budget) for i in range(0, len(rows), heads)]
        else:
            kept = pooled_keep(rows, len(rows) * self._budget)
            plan = [kept[i : i + heads] for i in range(0, len(kept), heads)]
        if self.mode == "evict":
            return plan
        self._hidden = []
        for layer_keep in plan:
            hidden = torch.full((heads, prompt), -torch.inf, device=self.scores.device)
            for head, index in enumerate(layer_keep):
                hidden[head, index] = 0.0
            self._hidden.append(hidden)
        return None

    def report(self) -> dict[str, Any]:
        # The record's meta says which mode ran, also when mode=mask is set on method=kvzip.
        return {"kvzip_mode": self.mode}

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        if self._hidden is None:
            return None
        prompt = positions < self.info.prefill_len
        bias = self._hidden[layer].gather(1, positions.clamp(max=self.info.prefill_len - 1))
        return bias.masked_fill(~prompt, 0.0)
