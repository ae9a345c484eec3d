"""Draft-model proposer: a smaller model sharing the target's tokenizer drafts
k tokens greedily for each decoding sequence.

The draft runs the engine's own model forward and attention backend on a small
KV block pool of its own. Its cache per sequence remembers which token ids it
holds; at each proposal the longest common prefix with the sequence's current
tokens stays, everything after it is recomputed. So a rejection (the target
took fewer drafts), a correction token, or a preempted-and-recomputed target
sequence need no extra bookkeeping: the draft simply re-feeds what changed.
A sequence the pool cannot hold gets no proposal (the target decodes normally)
rather than stalling the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.attention.base import AttentionBackend, AttentionMetadata


@dataclass
class _DraftSeq:
    tokens: list[int] = field(default_factory=list)  # token ids whose k/v sit in the draft cache, in order
    blocks: list[int] = field(default_factory=list)


class DraftModelProposer:
    def __init__(self, loaded, backend: AttentionBackend, num_speculative_tokens: int,
                 block_size: int = 16, num_blocks: int = 256):
        """`loaded`: an engine.core.models.LoadedModel (the draft); `num_blocks` sizes its private KV pool."""
        from engine.core.models import allocate_kv_cache

        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.loaded, self.model, self.backend = loaded, loaded.model, backend
        self.k, self.block_size = num_speculative_tokens, block_size
        self.kv_caches = allocate_kv_cache(loaded, num_blocks, block_size)
        self.num_blocks = num_blocks
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # a stack: pop() hands out low ids first
        self.seqs: dict[str, _DraftSeq] = {}

    # -- public ---------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: list[tuple[str, list[int], int]]) -> list[list[int]]:
        """requests: (seq_id, all token ids so far, k for this sequence) -> draft tokens each.

        One batched forward feeds every sequence's uncached tokens and drafts the
        first token; then k - 1 one-token steps draft the rest (sequences whose k
        is reached drop out of the batch).
        """
        drafts: list[list[int]] = [[] for _ in requests]
        active = []  # (index into requests, seq, tokens to feed)
        for i, (seq_id, token_ids, k) in enumerate(requests):
            k = min(k, self.k)
            if k < 1 or len(token_ids) + k > self.loaded.max_model_len:
                continue
            seq = self.seqs.setdefault(seq_id, _DraftSeq())
            self._rollback(seq, token_ids)
            # the draft of the last of k tokens is never fed back: k - 1 extra slots
            if not self._reserve(seq, len(token_ids) + k - 1):
                self.free(seq_id)
                continue
            active.append((i, seq, token_ids[len(seq.tokens):], k))
        while active:
            next_tokens = self._forward([(seq, feed) for _, seq, feed, _ in active])
            still = []
            for (i, seq, _, k), tok in zip(active, next_tokens, strict=True):
                drafts[i].append(tok)
                if len(drafts[i]) < k:
                    still.append((i, seq, [tok], k))
            active = still
        return drafts

    def free(self, seq_id: str) -> None:
        """Drop a finished (or aborted) sequence's draft cache."""
        seq = self.seqs.pop(seq_id, None)
        if seq is not None:
            self.free_blocks.extend(reversed(seq.blocks))

    def retain(self, live_seq_ids) -> None:
        """Drop the caches of sequences no longer alive (finished or aborted since last time)."""
        live = set(live_seq_ids)
        for seq_id in [s for s in self.seqs if s not in live]:
            self.free(seq_id)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    # -- internals ------------------------------------------------------------------

    def _rollback(self, seq: _DraftSeq, token_ids: list[int]) -> None:
        """Keep the longest prefix of the cached tokens that the sequence still has."""
        n = min(len(seq.tokens), len(token_ids))
        if seq.tokens[:n] != token_ids[:n]:
            n = next(j for j in range(n) if seq.tokens[j] != token_ids[j])
        if n == len(token_ids):  # at least one token must be fed to get logits for the next one
            n -= 1
        del seq.tokens[n:]

    def _reserve(self, seq: _DraftSeq, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size)
        while len(seq.blocks) > need:  # shrink: blocks beyond the new length go back to the pool
            self.free_blocks.append(seq.blocks.pop())
        if need - len(seq.blocks) > len(self.free_blocks):
            return False
        while len(seq.blocks) < need:
            seq.blocks.append(self.free_blocks.pop())
        return True

    def _forward(self, batch: list[tuple[_DraftSeq, list[int]]]) -> list[int]:
        """Feed each sequence's tokens, append them to its cache, return greedy next tokens."""
        device = self.loaded.device
        input_ids, positions, slots, query_lens, context_lens, tables = [], [], [], [], [], []
        for seq, feed in batch:
            start = len(seq.tokens)
            for j, tok in enumerate(feed):
                pos = start + j
                input_ids.append(tok)
                positions.append(pos)
                slots.append(seq.blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            seq.tokens.extend(feed)
            query_lens.append(len(feed))
            context_lens.append(len(seq.tokens))
            tables.append(seq.blocks)
        metadata = AttentionMetadata(query_lens=query_lens, context_lens=context_lens, block_tables=tables,
                                     slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                                     block_size=self.block_size)
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long, device=device),
                            torch.tensor(positions, dtype=torch.long, device=device),
                            metadata, self.kv_caches, self.backend)
        last = torch.tensor(query_lens, device=device).cumsum(0) - 1
        return self.model.compute_logits(hidden[last]).argmax(dim=-1).tolist()
