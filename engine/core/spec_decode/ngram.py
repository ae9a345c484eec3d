"""Prompt-lookup (n-gram) proposer: guess the continuation by copying history.

If the sequence's last n tokens occurred earlier in prompt + output, propose
the tokens that followed that occurrence. n goes from `ngram_max` down to
`ngram_min` (a longer match is stronger evidence); among matches of the same
n the most recent one wins (recent context predicts best). The copy reads
through its own proposals, so a periodic tail (e.g. "a b a b") keeps its
period for all k tokens instead of stopping where the history ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, ngram_min: int = 1, ngram_max: int = 4):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        if not (1 <= ngram_min <= ngram_max):
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.k, self.ngram_min, self.ngram_max = num_speculative_tokens, ngram_min, ngram_max

    def propose(self, token_ids: Sequence[int], k: int | None = None) -> list[int]:
        """Up to `k` (default: num_speculative_tokens) draft tokens; [] when nothing matches."""
        k = self.k if k is None else min(k, self.k)
        n_tokens = len(token_ids)
        if k < 1 or n_tokens < self.ngram_min + 1:
            return []
        start = self._find_match(np.asarray(token_ids, dtype=np.int64))
        if start is None:
            return []
        ext = list(token_ids)
        for j in range(k):  # src + j < len(ext) always: the copy may read its own output
            ext.append(ext[start + j])
        return ext[n_tokens:]

    def _find_match(self, tokens: np.ndarray) -> int | None:
        """Index right after the chosen earlier occurrence of the sequence's suffix, or None.

        Every earlier position holding the last token is a candidate; its match length
        is how far the tokens before it agree with those before the last token (capped
        at ngram_max). The longest match wins, the most recent among equals: the same
        as trying n = ngram_max .. ngram_min and taking the last occurrence of each.
        """
        last = len(tokens) - 1
        ends = np.flatnonzero(tokens[:last] == tokens[last])  # where an earlier match could end
        if ends.size == 0:
            return None
        length = np.ones(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for offset in range(1, min(self.ngram_max, last)):
            prev = ends - offset
            ok = (prev >= 0) & (tokens[np.maximum(prev, 0)] == tokens[last - offset])
            alive &= ok
            if not alive.any():
                break
            length += alive
        best = int(length.max())
        if best < self.ngram_min:
            return None
        return int(ends[np.flatnonzero(length == best)[-1]]) + 1
