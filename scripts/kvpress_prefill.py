"""kvpress's prefill presses on given prompts, for ``scripts/kvpress_peer_check.py``.

Runs in a separate environment that has kvpress (it pins its own transformers), so it imports
nothing of evictbench:

    python3 -m venv kvpress-venv && kvpress-venv/bin/pip install torch==2.13.0 kvpress==0.5.5

Reads a JSON request ``{"model": <folder>, "threads": T, "new_tokens": N, "presses": [{"press":
<name in PRESSES>, "rho": r}], "examples": [{"id": ..., "ids": [...]}]}`` on stdin and prints one
JSON row per press and example: the prompt positions each layer's KV heads keep after the prefill
(``kept[layer][head]``) and the greedy continuation (up to N tokens, ending at the end-of-turn).

Kept positions are read without kvpress's own bookkeeping: a masking press (AdaKV) names the
masked ones in ``masked_key_indices``; a press that gathers the cache is matched back, key row by
key row, to the keys it was handed (RoPE makes every position's key distinct).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from kvpress import AdaKVPress, ExpectedAttentionPress, KeyDiffPress, SnapKVPress, TOVAPress
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

PRESSES = {
    "AdaKVPress(ExpectedAttentionPress)": lambda rho: AdaKVPress(ExpectedAttentionPress(compression_ratio=rho)),
    "KeyDiffPress": lambda rho: KeyDiffPress(compression_ratio=rho),
    "TOVAPress": lambda rho: TOVAPress(compression_ratio=rho),
    "SnapKVPress": lambda rho: SnapKVPress(compression_ratio=rho),
}


def kept_positions(model: torch.nn.Module, handed: dict[int, torch.Tensor], cache: DynamicCache) -> list:
    """Per layer and KV head, the sorted prompt positions the press kept."""
    out = []
    for index, layer in enumerate(model.model.layers):
        original = handed[index][0]
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        heads = []
        for head in range(original.shape[0]):
            if masked is not None:
                gone = set(masked[2][masked[1] == head].tolist())
                heads.append([p for p in range(original.shape[1]) if p not in gone])
                continue
            kept = cache.layers[index].keys[0, head]
            match = (kept[:, None, :] == original[head][None, :, :]).all(dim=-1)
            heads.append(sorted(match.nonzero()[:, 1].tolist()))
        out.append(heads)
    return out


def main() -> None:
    request = json.load(sys.stdin)
    torch.set_num_threads(request["threads"])
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    end = AutoTokenizer.from_pretrained(request["model"]).eos_token_id
    for spec in request["presses"]:
        press = PRESSES[spec["press"]](spec["rho"])
        scorer = press.press if isinstance(press, AdaKVPress) else press
        handed: dict[int, torch.Tensor] = {}
        score = scorer.score

        def recording(module, hidden_states, keys, values, attentions, kwargs, score=score, handed=handed):
            handed[module.layer_idx] = keys.detach().clone()
            return score(module, hidden_states, keys, values, attentions, kwargs)

        scorer.score = recording
        for example in request["examples"]:
            ids = torch.tensor([example["ids"]])
            cache = DynamicCache()
            with torch.inference_mode():
                with press(model):
                    logits = model(ids, past_key_values=cache).logits
                kept = kept_positions(model, handed, cache)
                tokens: list[int] = []
                # Positions continue from the prompt's length, not from the shrunken cache's.
                for step in range(request["new_tokens"]):
                    tokens.append(int(logits[0, -1].argmax()))
                    if tokens[-1] == end:
                        break
                    position = torch.tensor([[ids.shape[1] + step]])
                    logits = model(torch.tensor([tokens[-1:]]), past_key_values=cache, position_ids=position).logits
            for layer in model.model.layers:
                layer.self_attn.masked_key_indices = None
            row = {"press": spec["press"], "rho": spec["rho"], "id": example["id"], "kept": kept, "tokens": tokens}
            row |= {"kvpress": version("kvpress"), "transformers": version("transformers")}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
