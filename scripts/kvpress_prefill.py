"""kvpress's prefill presses on given prompts, for ``scripts/kvpress_peer_check.py``.

Runs in a separate environment that has kvpress (it pins its own transformers), so it imports
nothing of evictbench:

    python3 -m venv kvpress-venv && kvpress-venv/bin/pip install torch==2.13.0 kvpress==0.5.5

Reads a JSON request ``{"model": <folder>, "threads": T, "new_tokens": N, "presses": [{"press":
<name in PRESSES>, "rho": r}], "examples": [{"id": ..., "ids": [...]}]}`` on stdin and prints one
JSON row per press and example: the prompt positions each layer's KV heads keep after the prefill
(``kept[layer][head]``) and the greedy continuation (up to N tokens, ending at the end-of-turn).

Kept positions are read without kvpress's own bookkeeping: a masking press (AdaKV, KVzip) names
the masked ones in ``masked_key_indices``; a press that gathers the cache is matched back, key row
by key row, to the keys it was handed (RoPE makes every position's key distinct).

``KVzipPress`` is handed the whole prompt, as the other presses are: it reconstructs everything
after the chat template's opening. ``KVzipPress(pipeline)`` runs it as kvpress's pipeline does:
the prompt up to the chat template's last closing (the end of the user turn, the assistant's
header) is prefilled under the press, and the rest (that closing and an answer prefix, which
the pipeline appends with the question) joins the compressed cache afterwards.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KVzipPress,
    ScorerPress,
    SnapKVPress,
    TOVAPress,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

PRESSES = {
    "AdaKVPress(ExpectedAttentionPress)": lambda rho: AdaKVPress(ExpectedAttentionPress(compression_ratio=rho)),
    "KeyDiffPress": lambda rho: KeyDiffPress(compression_ratio=rho),
    "TOVAPress": lambda rho: TOVAPress(compression_ratio=rho),
    "SnapKVPress": lambda rho: SnapKVPress(compression_ratio=rho),
    "KVzipPress": lambda rho: KVzipPress(compression_ratio=rho),
    "KVzipPress(pipeline)": lambda rho: KVzipPress(compression_ratio=rho),
}
#: Presses run as kvpress's pipeline runs them: the template's closing and what follows join after compression.
PIPELINE = {"KVzipPress(pipeline)"}


def closing_start(tokenizer: AutoTokenizer, ids: list[int]) -> int:
    """Where the prompt's last chat-template closing begins (the prompt's length where there is none)."""
    separator = "\n" + "#" * 8
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "context" + separator}], add_generation_prompt=True, tokenize=False
    )
    closing = tokenizer.encode(text.split(separator)[1], add_special_tokens=False)
    starts = [at for at in range(len(ids) - len(closing) + 1) if ids[at : at + len(closing)] == closing]
    return starts[-1] if starts else len(ids)


def kept_positions(model: torch.nn.Module, handed: dict[int, torch.Tensor], cache: DynamicCache, length: int) -> list:
    """Per layer and KV head, the sorted positions among the prompt's ``length`` the press kept."""
    out = []
    for index, layer in enumerate(model.model.layers):
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        heads = []
        for head in range(model.config.num_key_value_heads):
            if masked is not None:
                gone = set(masked[2][masked[1] == head].tolist())
                heads.append([p for p in range(length) if p not in gone])
                continue
            original = handed[index][0, head]
            kept = cache.layers[index].keys[0, head]
            match = (kept[:, None, :] == original[None, :, :]).all(dim=-1)
            heads.append(sorted(match.nonzero()[:, 1].tolist()))
        out.append(heads)
    return out


def recorded(press: object) -> dict[int, torch.Tensor]:
    """The keys a scoring press is handed, per layer (a gathering press's kept rows are matched back to them)."""
    handed: dict[int, torch.Tensor] = {}
    scorer = press.press if isinstance(press, AdaKVPress) else press
    if isinstance(scorer, ScorerPress):
        score = scorer.score

        def recording(module, hidden_states, keys, values, attentions, kwargs):
            handed[module.layer_idx] = keys.detach().clone()
            return score(module, hidden_states, keys, values, attentions, kwargs)

        scorer.score = recording
    return handed


def main() -> None:
    request = json.load(sys.stdin)
    torch.set_num_threads(request["threads"])
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(request["model"])
    end = tokenizer.eos_token_id
    for spec in request["presses"]:
        press = PRESSES[spec["press"]](spec["rho"])
        handed = recorded(press)
        for example in request["examples"]:
            ids = torch.tensor([example["ids"]])
            split = closing_start(tokenizer, example["ids"]) if spec["press"] in PIPELINE else ids.shape[1]
            cache = DynamicCache()
            with torch.inference_mode():
                with press(model):
                    logits = model(ids[:, :split], past_key_values=cache).logits
                if split < ids.shape[1]:
                    after = torch.arange(split, ids.shape[1])[None]
                    logits = model(ids[:, split:], past_key_values=cache, position_ids=after).logits
                kept = kept_positions(model, handed, cache, ids.shape[1])
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
