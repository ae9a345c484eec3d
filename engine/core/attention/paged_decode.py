"""Decode attention that reads the paged KV pool in place: FlexAttention's CPU template, compiled.

The torch backend's eager decode gathers each sequence's keys and values out of the pool into a
padded [B, KVH, Lmax, D] buffer and SDPA reads that buffer again: the pool's bytes are copied once
and read twice, and every row is padded to the longest context. Under compile_decode (a decode step is
one torch.compile graph) this module attends the pool where it lies instead. FlexAttention is given
the whole pool of a layer as one long key sequence ([1, KVH, num_blocks * block_size, D], a view, no
copy) and a block mask whose blocks are the cache's blocks: each sequence lists its own block ids, so
inductor's CPU template (at::cpublas micro-GEMMs over 16-key tiles) visits only the blocks it owns.
- every block but a sequence's last is whole: a "full" block, no mask applied;
- its last block is the one "partial" block, masked past the sequence's last key (`kv_idx < end_slot`, a
  slot of the pool; the template applies the mask to partial blocks only);
- which blocks a sequence owns is said by the block lists alone, not by the mask function: inductor's
  template honours the lists, while FlexAttention's eager math (what dynamo's "eager" backend would run)
  ignores them and would attend the whole pool. So this path is for inductor only (the runner says which);
- the query heads that share a kv head are that head's query rows (q [B, KVH, group, D]), so a key tile
  is read once per kv head and multiplied by `group` rows, not read `group` times as `enable_gqa` would.
Measured in isolation (B 24, contexts 100-768, 9/3 heads of 64, block 16, 2 threads): 2.6-2.7 ms a layer
for the gather + SDPA, 1.4-1.6 ms for this; with `enable_gqa` (one query row, flex's decoding template)
it was 2.2-10.5 ms depending on its partition size.

The block lists are two int32 buffers of [rows, num_blocks] per engine (`BlockLists`): FlexAttention
wants the partial list as wide as the pool has blocks (it checks `kv_len <= width * block_size`), though
a row reads only its first entry, and a full list of a fixed width keeps that width out of the compiled
graph's shapes (a width that changed every 16 tokens was duck-sized to a batch of the same size and
recompiled the graph mid-run, ~30 s). 64 rows of a 1 GiB pool of the reference model: 16 MiB, 1.6% of the
pool. Each step writes the first columns of its rows; row slices keep their strides, so the compiled graph
takes any batch size without recompiling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_UNAVAILABLE: str | None = "not checked"


def unavailable_reason(device: torch.device) -> str | None:
    """Why paged decode attention cannot run on `device` (None: it can). Inductor's CPU template needs
    AVX2 (flex_cpu.check_cpu_supported); on CUDA the flashinfer backend is the paged decode."""
    global _UNAVAILABLE
    if torch.device(device).type != "cpu":
        return f"paged decode attention is a CPU path, not {device}"
    if _UNAVAILABLE == "not checked":
        try:
            from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

            _UNAVAILABLE = None if check_cpu_supported() else "inductor's flex attention CPU template needs AVX2"
        except ImportError as e:  # a torch without FlexAttention's CPU lowering
            _UNAVAILABLE = f"FlexAttention's CPU lowering is missing from this torch: {e}"
    return _UNAVAILABLE


@dataclass
class DecodeBlocks:
    """One decode step's block mask, as tensors (built outside the graph, by the backend's prepare).
    The two lists are rows of the engine's shared buffers: `write` puts this step's ids there, and a step
    prepared ahead of another (multi-step decode's sub-steps) writes them again before its forward."""

    partial_num: torch.Tensor  # [B, 1, 1] int32: 1 (the last block)
    partial_index: torch.Tensor  # [B, 1, 1, num_blocks] int32: column 0 is the last block's id
    full_num: torch.Tensor  # [B, 1, 1] int32: whole blocks before it
    full_index: torch.Tensor  # [B, 1, 1, num_blocks] int32: their ids first
    end_slot: torch.Tensor  # [B] int64: the slot after the last key (last block * block size + keys in it)
    block_size: int
    last: torch.Tensor  # [B, 1] int32: what `write` puts in partial_index's column 0
    table: torch.Tensor  # [B, W] int32: what it puts in full_index's first W columns

    def write(self) -> None:
        self.partial_index[:, 0, 0, :1] = self.last
        self.full_index[:, 0, 0, :self.table.shape[1]] = self.table


class BlockLists:
    """The [rows, num_blocks] buffers of every step's block lists (see the module's docstring)."""

    def __init__(self, num_blocks: int, device: torch.device):
        self.num_blocks = num_blocks
        self.device = device
        self._partial = self._full = torch.zeros(0, num_blocks, dtype=torch.int32, device=device)

    def _rows(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        if b > self._partial.shape[0]:  # grows by doubling: a step of a new largest batch
            n = max(b, 2 * self._partial.shape[0], 16)
            self._partial = torch.zeros(n, self.num_blocks, dtype=torch.int32, device=self.device)
            self._full = torch.zeros(n, self.num_blocks, dtype=torch.int32, device=self.device)
        return self._partial[:b], self._full[:b]

    def decode_blocks(self, tables: list[list[int]], context_lens: list[int], block_size: int) -> DecodeBlocks:
        """The block mask of decode sequences with these block tables and context lengths (keys in the
        cache, this step's included)."""
        full = [(n - 1) // block_size for n in context_lens]
        width = max(full) + 1
        rows = []
        for i, (table, f, n) in enumerate(zip(tables, full, context_lens)):
            if len(table) <= f:
                raise ValueError(f"sequence {i}: {len(table)} blocks cannot hold {n} tokens "
                                 f"(block size {block_size})")
            rows.append(table[:f + 1] + [0] * (width - f - 1))
        table_t = torch.tensor(rows, dtype=torch.int32)
        full_t = torch.tensor(full)
        last = table_t.gather(1, full_t[:, None]).to(self.device)  # [B, 1]
        b, nb = len(tables), self.num_blocks
        partial, full_rows = self._rows(b)
        end_slot = last[:, 0].long() * block_size + (torch.tensor(context_lens) - full_t * block_size).to(self.device)
        blocks = DecodeBlocks(partial_num=torch.ones(b, 1, 1, dtype=torch.int32, device=self.device),
                              partial_index=partial.view(b, 1, 1, nb),
                              full_num=full_t.to(torch.int32).view(b, 1, 1).to(self.device),
                              full_index=full_rows.view(b, 1, 1, nb), end_slot=end_slot, block_size=block_size,
                              last=last, table=table_t.to(self.device))  # the table's last block: never read
        blocks.write()
        return blocks


def attend(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, blocks: DecodeBlocks,
           scale: float) -> torch.Tensor:
    """q [B, H, D] (one decode token per sequence) over the pool's slots k_flat/v_flat [slots, KVH, D]
    -> [B, H, D]. Inside a compiled graph: eager FlexAttention would score every key of the pool."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    slots, kv_heads, head_dim = k_flat.shape
    block_size = blocks.block_size
    b, heads, _ = q.shape
    group = heads // kv_heads
    end = blocks.end_slot

    def written(batch, head, q_idx, kv_idx):  # evaluated on the last block only: the keys written so far
        return kv_idx < end[batch]

    mask = BlockMask.from_kv_blocks(blocks.partial_num, blocks.partial_index, blocks.full_num, blocks.full_index,
                                    BLOCK_SIZE=(group, block_size), mask_mod=written,
                                    seq_lengths=(group, slots), compute_q_blocks=False)
    keys = k_flat.unsqueeze(0).transpose(1, 2)  # [1, KVH, slots, D], a view
    values = v_flat.unsqueeze(0).transpose(1, 2)
    # the scale applied here makes the query a 4-d buffer of its own (B*H*D floats): inductor's template
    # reads the layout under a view, the 3-d q (a view, or a no-op clone, fails to lower)
    queries = q.view(b, kv_heads, group, head_dim) * scale
    out = flex_attention(queries, keys, values, block_mask=mask, scale=1.0)
    return out.reshape(b, heads, head_dim)
