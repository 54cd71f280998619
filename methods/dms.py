"""DMS (Łańcucki et al. 2025, "Inference-Time Hyper-Scaling with KV Cache Compression") as KVpop's baseline.

KVpop (arXiv 2607.05061), Sec. 4 and App. H: DMS learns per KV head a binary eviction decision at
insertion with a differentiable relaxation, and delays the eviction until the token leaves a
sliding window. KVpop trains it "with the same budget as KVpop" and a gate of the KVpop scorers'
size (``harness.training.dms``: a keep logit from the token's ``[k; v]``). Our reading of the same
budget at inference: the keep logit ranks the eligible tokens, which a fixed ``B = s + w + k``
per head holds (decided at insertion, evicted only once out of the window); DMS's own threshold
rule lets heads hold different counts, which the paper's App. H shows concentrates capacity in a
few heads, and is not implemented here.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.kvpop.policy import KVpop


@dataclass
class DMS(KVpop):
    """DMS under a fixed per-head budget: ``s`` sinks, ``w`` recent, the ``k`` older tokens with the highest
    keep logit (no decay: the gate's checkpoint has ``gamma = 1``). Parameters as ``KVpop``'s."""

    name: str = "dms"

    objective = "dms"
