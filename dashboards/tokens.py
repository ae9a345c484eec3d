"""Token IDs beside their strings, with whitespace and invisible characters made visible.

Decoding needs the replica's tokenizer (a Hugging Face tokenizer directory with
tokenizer.json); without one the dashboard shows the IDs only. The tokenizer is the engine's
own `engine.core.tokenization.Tokenizer`: a token's string here is `Tokenizer.piece`, a sequence's text
`Tokenizer.decode(..., skip_special_tokens=False)`, exactly what the engine and the diagnostics use.
"""

from __future__ import annotations

import functools
import unicodedata

import pandas as pd

from engine.core.tokenization import Tokenizer
from telemetry.contract import derived

# what a person should see instead of characters that render as nothing (or as a blank)
VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"}
# categories whose characters are invisible or ambiguous: controls, format (zero-width ...),
# separators other than the plain space, unassigned and private-use code points
ESCAPED_CATEGORIES = {"Cc", "Cf", "Zs", "Zl", "Zp", "Cn", "Co", "Cs"}


def visible(text: str) -> str:
    """`text` with every space, newline, tab, control and zero-width character made visible."""
    out = []
    for ch in text:
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif unicodedata.category(ch) in ESCAPED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


@functools.lru_cache(maxsize=16)
def load_tokenizer(tokenizer_dir: str) -> Tokenizer:
    """The engine's tokenizer for a model or tokenizer directory (or a tokenizer.json file), loaded once."""
    return Tokenizer(tokenizer_dir, cache_size=0)


def token_frame(ids, tokenizer: Tokenizer | None = None, times=None) -> pd.DataFrame:
    """One row per token: position, id, its string made visible (when a tokenizer is given),
    and for output tokens the time offset from arrival and the gap to the previous token."""
    ids = [int(i) for i in ids]
    frame = pd.DataFrame({"position": range(len(ids)), "id": ids})
    if tokenizer is not None:
        frame["token"] = [visible(piece) for piece in tokenizer.pieces(ids)]
    if times is not None and len(times) == len(ids):
        t = pd.Series([float(x) for x in times])
        frame["t (s)"] = t.round(6)
        # the per-gap ITL as telemetry.contract.derived defines it (the first token has none: its latency is TTFT)
        frame["gap (ms)"] = pd.Series([float("nan")] + [g * 1000 for g in derived.itl_gaps(list(t))]).round(3)
    return frame
