"""Evidence for token problems: the exact IDs, where two sequences first diverge, and what they decode to.

Tokens are rendered by the replica's `engine.core.tokenization.Tokenizer` (`piece`, `decode` with special
tokens shown): the strings the dashboard shows for the same IDs.
"""

from __future__ import annotations

from engine.core.tokenization import Tokenizer
from evals.stats import first_divergence

WINDOW = 4  # tokens shown on each side of the first divergence


def tokens(ids, tokenizer: Tokenizer | None, start: int = 0, stop: int | None = None) -> list[dict]:
    """[{"position", "id", "text"}] for ids[start:stop] ("text" only when a tokenizer is at hand)."""
    out = []
    for pos in range(start, len(ids) if stop is None else min(stop, len(ids))):
        entry = {"position": pos, "id": int(ids[pos])}
        if tokenizer is not None:
            entry["text"] = tokenizer.piece(int(ids[pos]))
        out.append(entry)
    return out


def divergence(a_ids, b_ids, a_tok: Tokenizer | None = None, b_tok: Tokenizer | None = None, a_name: str = "a",
               b_name: str = "b") -> dict:
    """Both sequences (IDs), the first position where they differ, the tokens around it and the
    decoded text of each side from there (each side decoded with its own tokenizer where known)."""
    a_ids, b_ids = [int(x) for x in a_ids], [int(x) for x in b_ids]
    pos = first_divergence(a_ids, b_ids)
    out = {f"{a_name}_token_ids": a_ids, f"{b_name}_token_ids": b_ids, "first_divergence": pos,
           "identical": pos is None}
    if pos is None:
        return out
    lo, hi = max(0, pos - WINDOW), pos + WINDOW + 1
    for name, ids, tok in ((a_name, a_ids, a_tok or b_tok), (b_name, b_ids, b_tok or a_tok)):
        out[f"{name}_tokens_at_divergence"] = tokens(ids, tok, lo, hi)
        if tok is not None:
            out[f"{name}_text_from_divergence"] = tok.decode(ids[pos:pos + 16], skip_special_tokens=False)
            out[f"{name}_text"] = tok.decode(ids, skip_special_tokens=False)
    return out
