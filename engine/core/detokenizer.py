"""Incremental detokenization for streaming, with stop strings.

Decoding one token at a time does not work with byte-level tokenizers: a
multi-byte UTF-8 character can be split across tokens, and decoding half of
it gives U+FFFD. So text is decoded over a small window of recent tokens
(the scheme vLLM and TGI use): `prefix_offset..read_offset` is text already
emitted, `prefix_offset..end` is that plus the new tokens; the difference is
new text, held back while it ends in an incomplete character. The window
always starts where the previous text ended on a whole character, so the
pieces concatenate to exactly the full decode.

Stop strings are searched in the text; the text is cut where the first one
starts (the stop string itself is not part of the output). While streaming,
the last `max(len(stop)) - 1` characters are held back, so that no streamed
text is ever taken back when a stop string completes later.
"""

from __future__ import annotations

from typing import Callable

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str] | None = None):
        """`decode(ids) -> str` is the tokenizer's full decode (special tokens skipped)."""
        self.decode = decode
        self.token_ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self.stop = [s for s in (stop or []) if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.stopped_by: str | None = None  # the stop string that ended the text
        self.num_emitted_chars = 0  # text already handed out by `take_new_text`

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Feed new tokens; returns the stop string if one completed (the text is then final)."""
        if self.stopped_by is not None:
            return self.stopped_by
        self.token_ids.extend(token_ids)
        before = len(self.text)
        prefix_text = self.decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self.decode(self.token_ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            self.text += new_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.token_ids)
        return self._check_stop(before) if self.stop and len(self.text) > before else None

    def finish(self) -> None:
        """The sequence ended: add whatever is still held back (incomplete characters included)."""
        if self.stopped_by is not None:
            return
        prefix_text = self.decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self.decode(self.token_ids[self.prefix_offset:])
        before = len(self.text)
        self.text += new_text[len(prefix_text):]
        self.prefix_offset = self.read_offset = len(self.token_ids)
        if self.stop and len(self.text) > before:
            self._check_stop(before)

    def _check_stop(self, before: int) -> str | None:
        # a stop string that completes now ends inside the new text
        start = max(0, before - self.holdback)
        best = None
        for s in self.stop:
            at = self.text.find(s, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        self.text = self.text[:best[0]]
        self.stopped_by = best[1]
        return best[1]

    def take_new_text(self, final: bool) -> str:
        """Text not handed out yet; holds back a possible stop-string prefix until `final`."""
        end = len(self.text) if final or self.stopped_by is not None else len(self.text) - self.holdback
        if end <= self.num_emitted_chars:
            return ""
        new = self.text[self.num_emitted_chars:end]
        self.num_emitted_chars = end
        return new
