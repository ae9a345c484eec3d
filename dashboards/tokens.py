"""Token IDs beside their strings, with whitespace and invisible characters made visible.

Decoding needs the replica's tokenizer (a Hugging Face tokenizer directory with
tokenizer.json); without one the dashboard shows the IDs only.
"""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path

import pandas as pd

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


class TokenDecoder:
    """Decodes IDs with a `tokenizers` tokenizer loaded from a Hugging Face directory."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir}")
        self.source = str(path)
        self.tokenizer = Tokenizer.from_file(str(file))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: int) -> str:
        """One token on its own (a partial UTF-8 sequence decodes to U+FFFD)."""
        if not 0 <= token_id < self.vocab_size:
            return f"<out of vocabulary: {token_id}>"
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    def text(self, ids) -> str:
        ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@functools.lru_cache(maxsize=16)
def load_decoder(tokenizer_dir: str) -> TokenDecoder:
    return TokenDecoder(tokenizer_dir)


def token_frame(ids, decoder: TokenDecoder | None = None, times=None) -> pd.DataFrame:
    """One row per token: position, id, its string made visible (when a decoder is given),
    and for output tokens the time offset from arrival and the gap to the previous token."""
    ids = [int(i) for i in ids]
    frame = pd.DataFrame({"position": range(len(ids)), "id": ids})
    if decoder is not None:
        frame["token"] = [visible(decoder.token(i)) for i in ids]
    if times is not None and len(times) == len(ids):
        t = pd.Series([float(x) for x in times])
        frame["t (s)"] = t.round(6)
        frame["gap (ms)"] = (t.diff() * 1000).round(3)
    return frame
