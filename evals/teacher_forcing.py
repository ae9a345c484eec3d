"""Teacher-forced full-vocabulary log-probabilities under an engine's own model.

The candidate's numbers must come from exactly what the engine runs (its
forward, its dtype, its quantized layers), so this drives the model of an
`LLMEngine` built from the candidate's EngineConfig: one flat prefill over
prompt + output per batch, with private KV blocks (the engine's own pool and
scheduler are left untouched).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch


class EngineScorer:
    """Full-vocabulary next-token log-probs of given token sequences, from an engine's model."""

    def __init__(self, engine, max_batch_tokens: int = 4096):
        self.engine = engine
        self.loaded = engine.loaded
        self.backend = engine.backend
        self.block_size = engine.config.block_size
        self.max_batch_tokens = max_batch_tokens

    @property
    def vocab_size(self) -> int:
        return self.loaded.vocab_size

    def _batches(self, sequences: list[list[int]]) -> Iterator[list[int]]:
        batch, tokens = [], 0
        for i, seq in enumerate(sequences):
            if batch and tokens + len(seq) > self.max_batch_tokens:
                yield batch
                batch, tokens = [], 0
            batch.append(i)
            tokens += len(seq)
        if batch:
            yield batch

    @torch.inference_mode()
    def logprobs(self, sequences: list[list[int]], starts: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        """For each sequence i, yield (i, array [len - start_i, V]): row t is the log-distribution
        that predicts token `start_i + t` given everything before it (float64)."""
        from engine.core.attention.base import AttentionMetadata
        from engine.core.models import allocate_kv_cache

        if len(sequences) != len(starts):
            raise ValueError("need one start per sequence")
        max_len = self.engine.max_model_len
        for i, (seq, start) in enumerate(zip(sequences, starts)):
            if not 1 <= start <= len(seq):
                raise ValueError(f"sequence {i}: start {start} must be in [1, {len(seq)}] (a prompt token first)")
            if len(seq) > max_len:
                raise ValueError(f"sequence {i} has {len(seq)} tokens, more than the model's {max_len}")
            if max(seq) >= self.vocab_size or min(seq) < 0:
                raise ValueError(f"sequence {i} holds token ids outside the vocabulary [0, {self.vocab_size})")
        bs = self.block_size
        device = self.loaded.device
        for batch in self._batches(sequences):
            seqs = [sequences[i] for i in batch]
            need = [(len(s) + bs - 1) // bs for s in seqs]
            kv = allocate_kv_cache(self.loaded, sum(need), bs)
            tables, first = [], 0
            for n in need:
                tables.append(list(range(first, first + n)))
                first += n
            ids, pos, slots, rows = [], [], [], []
            for s, table, i in zip(seqs, tables, batch):
                base = len(ids)
                ids.extend(s)
                pos.extend(range(len(s)))
                slots.extend(table[p // bs] * bs + p % bs for p in range(len(s)))
                rows.append((i, base + starts[i] - 1, base + len(s) - 1))
            lens = [len(s) for s in seqs]
            metadata = AttentionMetadata(query_lens=lens, context_lens=lens, block_tables=tables,
                                         slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                                         block_size=bs)
            hidden = self.loaded.model(torch.tensor(ids, device=device), torch.tensor(pos, device=device),
                                       metadata, kv, self.backend)
            for i, lo, hi in rows:
                logits = self.loaded.model.compute_logits(hidden[lo:hi]).double()
                yield i, torch.log_softmax(logits, dim=-1).cpu().numpy()
