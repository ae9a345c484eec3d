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
from numpy.lib.stride_tricks import sliding_window_view


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
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.ngram_max, n_tokens - 1), self.ngram_min - 1, -1):
            start = _last_earlier_match(tokens, n)
            if start is None:
                continue
            ext = list(token_ids)
            src = start + n  # first token after the match; src < n_tokens
            for j in range(k):
                ext.append(ext[src + j])
            return ext[n_tokens:]
        return []


def _last_earlier_match(tokens: np.ndarray, n: int) -> int | None:
    """Start of the last occurrence of the final n tokens that ends before the final token."""
    suffix = tokens[-n:]
    windows = sliding_window_view(tokens[:-1], n)  # windows ending before the last token
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    return int(hits[-1]) if hits.size else None
