"""Greedy answers from a transformers model: the reference the engine is checked against."""

from __future__ import annotations

import torch


def chat_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of a one-turn chat prompt ending with the assistant marker."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


@torch.no_grad()
def greedy_generate(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int = 24,
                    batch_size: int = 64) -> list[list[int]]:
    """Greedy continuations (without the EOS) of each prompt, batched with left padding."""
    model.eval()
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    out: list[list[int]] = []
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start:start + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=pad)
        for row in gen[:, width:].tolist():
            out.append(row[:row.index(eos)] if eos in row else row)
    return out
