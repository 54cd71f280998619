"""KVzip (Kim et al. 2025, arXiv:2505.23416): query-agnostic eviction by what reconstructing the context needs.

After the prefill the model reads the prompt again, chunk by chunk, after an instruction to repeat
it (``ContextReconstruction``; the harness runs the passes inside ``prefill_s``). An entry's
score, per KV head, is the largest attention any query of its group pays it while its chunk is
reconstructed; as in kvpress's ``KVzipPress``, each chunk's queries attend to the sinks, the
chunk's own prompt entries and the pass's earlier entries only. The budget is pooled: the best
entries over every layer and head (``layerwise=false``, the default) or over each layer's heads,
so per-head counts differ.

Which part of the prompt is reconstructed is a reading (``context``); the harness finds the chat
template's parts with the tokenizer, and the method learns them from the spans its passes cover:

- ``whole_prompt`` (the default, this harness's first reading): the whole prompt, every entry scored.
- ``after_template``: what kvpress's press does to the ids it is handed: everything after the chat
  template's opening (a system turn it adds and the user turn's header) is reconstructed; the opening's
  entries beyond the sinks stay unscored (score 0, so they go first).
- ``user_content``: kvpress's pipeline, which compresses the template's opening and the context and
  only then appends the question, the template's closing and the answer prefix: the passes
  reconstruct the user content, the opening stays unscored, and whatever follows the content (the
  template's closing, a task's answer prefix) is kept whole, outside the pooled count. Our passes
  still run with those closing entries in the cache (the prompt is prefilled in one piece), which
  kvpress's pipeline has not yet seen when it compresses.

How many entries the pool keeps is another (``pool``): ``budget`` keeps ``L * H * B`` (``H * B``
per layer with ``layerwise``), B the harness's per-head budget, the kept closing included;
``kvpress`` keeps kvpress's count of what it compresses, ``numel - int(numel * rho)`` with
``numel`` the entries before the closing (over all layers and heads, or per layer), the closing
on top.

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
#: What the passes reconstruct (the module's docstring): the whole prompt, all after the chat
#: template's opening (kvpress's press on a whole prompt), or the user content (kvpress's pipeline).
CONTEXTS = ("whole_prompt", "after_template", "user_content")
#: How many entries the pooled budget keeps: ``L * H * B``, or kvpress's ``numel - int(numel * rho)``.
POOLS = ("budget", "kvpress")


@dataclass(frozen=True)
class ContextReconstruction(Reconstruction):
    """KVzip's passes and which part of the prompt they reconstruct (one of ``CONTEXTS``).

    The harness (``harness.decode.reconstruction``) finds that part with the tokenizer's chat
    template; the method learns it back from the spans its passes cover, so it needs no tokenizer.
    """

    context: str = "whole_prompt"


@dataclass
class KVzip(EvictionMethod):
    """Score every prompt entry by context reconstruction, keep the best physically or by mask.

    Parameters:
        selection: budget B (per layer and KV head on average), sinks always kept (kvpress: 4),
            granularity ``head``.
        mode: ``evict`` (physically) or ``mask`` (kept in memory, hidden from attention).
        layerwise: the same number of entries in every layer instead of one pool.
        context: what the passes reconstruct, ``whole_prompt``, ``after_template`` or
            ``user_content`` (the module's docstring).
        pool: how many entries the pool keeps, ``budget`` (``L * H * B``) or ``kvpress`` (its
            ``numel - int(numel * rho)``, which needs rho rather than a fixed budget).
        chunk: prompt tokens reconstructed per pass (kvpress: 2048).
        overlap: tokens of the previous chunk repeated after the later instruction (kvpress: 8).
        first, later: the repeat instructions (kvpress's).
        name: label for records and tables.
    """

    selection: Selection
    mode: str = "evict"
    layerwise: bool = False
    context: str = "whole_prompt"
    pool: str = "budget"
    chunk: int = 2048
    overlap: int = 8
    first: str = "\n\nRepeat the previous context exactly."
    later: str = "\n\nRepeat the part of the previous context exactly, starting with"
    name: str = "kvzip"

    def __post_init__(self) -> None:
        for option, value, choices in (("mode", self.mode, MODES), ("context", self.context, CONTEXTS),
                                       ("pool", self.pool, POOLS)):  # fmt: skip
            if value not in choices:
                raise ValueError(f"method.{option}={value!r} is not a KVzip {option} — use one of {', '.join(choices)}")
        if self.selection.granularity != "head":
            raise ValueError(
                f"method.selection.granularity={self.selection.granularity!r} does not suit KVzip, which keeps entries"
                " per KV head — use method.selection.granularity=head"
            )
        if self.pool == "kvpress" and self.selection.budget_tokens is not None:
            raise ValueError(
                f"method.pool=kvpress counts kvpress's entries from rho, but method.selection.budget_tokens="
                f"{self.selection.budget_tokens} fixes the budget — use method.pool=budget, or drop budget_tokens"
            )
        require_int("method.chunk", self.chunk, minimum=1, example=2048)
        require_int("method.overlap", self.overlap, minimum=0, example=8)

    def check(self, info: SequenceInfo) -> int | None:
        return self.selection.budget_for(info.prefill_len)

    def begin(self, info: SequenceInfo) -> None:
        super().begin(info)
        self._budget = self.check(info)
        self.scores = torch.zeros(info.num_layers, info.num_kv_heads, info.prefill_len, device=info.device)
        # Where the latest pass's span ends (the passes run in the prompt's order): the prompt's
        # entries from there on are kept whole. Without passes, nothing is.
        self._end = info.prefill_len
        self._hidden: list[Tensor] | None = None

    def budget(self) -> int | None:
        return self._budget

    def appends_only(self) -> bool:
        return True  # the cut (or mask) is the prefill's; a decoded entry is never masked

    def _evicts(self) -> bool:
        return self._budget is not None and self._budget < self.info.prefill_len

    def reconstruction(self) -> Reconstruction | None:
        if not self._evicts():
            return None
        return ContextReconstruction(self.chunk, self.first, self.later, self.overlap, self.context)

    def observe_reconstruction(self, view: LayerView, start: int, end: int) -> None:
        prompt = self.info.prefill_len
        self._end = end
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
        # Entries before the first reconstructed one (the template's opening) keep score 0;
        # those after the last (its closing) are kept whole, as kvpress's pipeline appends them.
        end = self._end
        rows = []
        for layer, layer_positions in enumerate(positions):
            protected = self.selection.protected(layer_positions, self.info.prefill_len, self._budget)
            rows.extend(self.scores[layer].masked_fill(protected | (layer_positions >= end), torch.inf).unbind(0))
        heads = self.info.num_kv_heads
        if self.layerwise:
            plan = [pooled_keep(rows[i : i + heads], self._kept(heads, end)) for i in range(0, len(rows), heads)]
        else:
            kept = pooled_keep(rows, self._kept(len(rows), end))
            plan = [kept[i : i + heads] for i in range(0, len(kept), heads)]
        if self.mode == "evict":
            return plan
        self._hidden = []
        for layer_keep in plan:
            hidden = torch.full((heads, self.info.prefill_len), -torch.inf, device=self.scores.device)
            for head, index in enumerate(layer_keep):
                hidden[head, index] = 0.0
            self._hidden.append(hidden)
        return None

    def _kept(self, heads: int, end: int) -> int:
        """Entries ``heads`` pooled heads keep in all, when the passes reconstructed the prompt up to ``end``."""
        closing = self.info.prefill_len - end
        if self.pool == "kvpress":
            # kvpress counts what it prunes, int(numel * rho), and keeps the rest: (1 - rho) * numel
            # rounded up where B is rounded down. The closing joins its cache after compression.
            numel = heads * end
            return numel - int(numel * self.selection.rho) + heads * closing
        if self._budget < self.selection.sinks + closing:
            raise ValueError(
                f"budget B={self._budget} cannot hold the {self.selection.sinks} sinks and the {closing} entries after"
                f" the user content that method.context={self.context} keeps whole — lower rho, or use"
                " method.pool=kvpress"
            )
        return heads * self._budget

    def report(self) -> dict[str, Any]:
        # The record's meta says which mode ran, also when mode=mask is set on method=kvzip.
        return {"kvzip_mode": self.mode}

    def logit_bias(self, layer: int, positions: Tensor) -> Tensor | None:
        if self._hidden is None:
            return None
        prompt = positions < self.info.prefill_len
        bias = self._hidden[layer].gather(1, positions.clamp(max=self.info.prefill_len - 1))
        return bias.masked_fill(~prompt, 0.0)
