"""Token-level diff of two ID sequences (eval outputs of a baseline and a candidate).

Where two outputs first diverge is the gate's own `evals.stats.first_divergence`;
token strings are the engine tokenizer's `piece`s.
"""

from __future__ import annotations

import difflib
import html

from dashboards.tokens import visible
from engine.core.tokenization import Tokenizer


def diff_ops(a, b) -> list[tuple[str, list[int], list[int]]]:
    """(op, a_ids, b_ids) runs: op is equal | replace | delete | insert (difflib opcodes)."""
    matcher = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
    return [(op, list(a[i1:i2]), list(b[j1:j2])) for op, i1, i2, j1, j2 in matcher.get_opcodes()]


def _label(ids, tokenizer: Tokenizer | None) -> list[str]:
    if tokenizer is None:
        return [str(i) for i in ids]
    return [visible(piece) for piece in tokenizer.pieces(ids)]


def diff_html(a, b, decoder: Tokenizer | None = None) -> str:
    """The diff as HTML: tokens only in the baseline struck through in red, tokens only in the
    candidate in green, shared tokens plain; every token in its own box (escaped)."""
    parts = []
    style = {"equal": "", "delete": "background:#fdd;text-decoration:line-through;",
             "insert": "background:#dfd;"}
    for op, xs, ys in diff_ops(a, b):
        runs = [("delete", xs), ("insert", ys)] if op == "replace" else [(op, xs if op != "insert" else ys)]
        for kind, ids in runs:
            for tid, label in zip(ids, _label(ids, decoder)):
                parts.append(f'<span title="id {tid}" style="border:1px solid #ccc;border-radius:3px;'
                             f'padding:0 2px;margin:1px;display:inline-block;font-family:monospace;'
                             f'{style[kind]}">{html.escape(label)}</span>')
    return "".join(parts)
