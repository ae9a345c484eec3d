"""A minimal paged batch builder for tests and check scripts (the engine has its real block pool).

Hands out blocks from a shuffled free list (so sequences' blocks are not
contiguous and paging is really exercised) and turns a list of
(sequence, new token ids) chunks into one flat step: input ids, positions and
`AttentionMetadata`.
"""

from __future__ import annotations

import random

import torch

from engine.core.attention.base import AttentionMetadata


class SimplePagedBatcher:
    def __init__(self, num_blocks: int, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.blocks: dict = {}  # sequence -> block ids
        self.lengths: dict = {}  # sequence -> tokens in the cache

    def step(self, chunks: list[tuple[object, list[int]]], device: str | torch.device = "cpu"):
        """-> (input_ids [T], positions [T], metadata) for the chunks, in order."""
        ids, positions, slots = [], [], []
        query_lens, context_lens, tables = [], [], []
        for seq, tokens in chunks:
            start = self.lengths.get(seq, 0)
            end = start + len(tokens)
            blocks = self.blocks.setdefault(seq, [])
            while len(blocks) * self.block_size < end:
                if not self.free:
                    raise RuntimeError("SimplePagedBatcher: out of blocks")
                blocks.append(self.free.pop())
            for pos in range(start, end):
                slots.append(blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            ids.extend(tokens)
            positions.extend(range(start, end))
            query_lens.append(len(tokens))
            context_lens.append(end)
            tables.append(list(blocks))
            self.lengths[seq] = end
        metadata = AttentionMetadata(query_lens=query_lens, context_lens=context_lens, block_tables=tables,
                                     slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                                     block_size=self.block_size)
        return (torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(positions, dtype=torch.long, device=device), metadata)

    def release(self, seq) -> None:
        self.free.extend(self.blocks.pop(seq, []))
        self.lengths.pop(seq, None)
