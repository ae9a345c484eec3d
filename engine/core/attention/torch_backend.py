"""Paged attention in plain torch: runs on the CPU here and on any device.

Per step, `prepare` turns the metadata into a few index tensors that every
layer shares (stored in `metadata.scratch`), so a layer does one cache write
and one SDPA call per group of sequences, with no Python loop over sequences:
- decode sequences (one new token each) form one group (two to four when their
  context lengths differ so much that padding would dominate): their cached
  keys/values are gathered into a padded [B, Lmax] batch with a length mask
  (none when all lengths are equal, as at batch 1); the group's index tensors are
  built from the block tables in about ten tensor ops, and a step whose decode batch
  has the same sequences and block tables as the last one reuses them (one view);
- a prefill with nothing cached before it (the common "first chunk" case) attends its
  own fresh keys alone with `is_causal`, without reading the cache: no gather, no mask,
  and the flash kernel skips the masked half. Grouping such chunks (padded, masked, their
  keys gathered from the cache) cost more at every length measured (one layer of the 135M
  model's heads, 8-16 prompts: 16-64 tokens 0.9 -> 0.8 ms, 128-256 10.4 -> 7.5 ms, 16-512
  18 -> 13 ms for the SDPA calls alone); the 135M mixed workload's prefill forwards spent
  4.5 of 22.9 s in SDPA;
- other prefill chunks (a cached prefix before them) are grouped by the power of two of
  their length (so padding wastes at most half of a group), each group one masked SDPA call;
- under compile_decode (inductor, a CPU with AVX2) a decode step's group attends the pool
  in place instead of gathering it: paged_decode.py, its block lists built here by `prepare`;
- a decode step replayed as a CUDA graph (engine/core/cuda_graph.py) plans nothing here: its metadata
  carries the graph's fixed-shape buffers and static_decode.py attends through them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.core.attention import paged_decode, static_decode
from engine.core.attention.base import AttentionBackend, AttentionMetadata

_SCRATCH_KEY = "torch_plan"


@dataclass
class _Group:
    """Sequences attended by one SDPA call."""

    is_decode: bool
    token_index: torch.Tensor  # [B, Qmax]: row of each query in the flat batch (padding -> 0)
    slots: torch.Tensor | None  # [B, Lmax]: cache slot of each key position (padding -> 0)
    mask: torch.Tensor | None  # decode [B, 1, 1, Lmax]; prefill [B, 1, Qmax, Lmax]; True = attend
    valid: torch.Tensor | None  # [B * Qmax] bool: real (not padding) query rows; None if all real
    out_index: torch.Tensor  # [num real rows]: where each real row goes in the flat output
    fresh_causal: bool = False  # one sequence, nothing cached before: attend fresh k/v causally
    token_start: int = 0  # first row of a fresh_causal sequence in the flat batch
    # num_kv_heads -> gather index, and (kv heads, head dim, dtype, device) -> gather index and
    # buffer views: built by the first layer, used by all
    head_rows: dict = field(default_factory=dict)
    # compile_decode on a CPU that can: the block mask of attending the pool in place (paged_decode.py)
    paged: paged_decode.DecodeBlocks | None = None

    def kv_rows(self, num_kv_heads: int, memo: bool = True) -> torch.Tensor:
        """Flat [B * KVH * Lmax] index of (slot, kv head) rows, so a gather lands head-major."""
        rows = self.head_rows.get(num_kv_heads)
        if rows is None:
            heads = torch.arange(num_kv_heads, device=self.slots.device)
            rows = (self.slots[:, None, :] * num_kv_heads + heads[None, :, None]).reshape(-1)
            if memo:
                self.head_rows[num_kv_heads] = rows
        return rows


@dataclass
class _Plan:
    groups: list[_Group]
    identity: bool  # one group whose rows are exactly the flat batch in order: no scatter needed


def _seq_slots(block_tables: list[list[int]], lengths: list[int], block_size: int,
               device: torch.device) -> torch.Tensor:
    """[B, max(lengths)] cache slot of every position (positions past a length map to slot 0)."""
    lmax = max(lengths)
    nblocks = (lmax + block_size - 1) // block_size
    rows = []
    for i, (blocks, length) in enumerate(zip(block_tables, lengths)):
        if len(blocks) * block_size < length:
            raise ValueError(f"sequence {i}: {len(blocks)} blocks cannot hold {length} tokens "
                             f"(block size {block_size})")
        row = blocks[:nblocks]
        rows.append(row + [0] * (nblocks - len(row)))
    table = torch.tensor(rows, dtype=torch.long)
    pos = torch.arange(lmax)
    slots = table[:, pos // block_size] * block_size + pos % block_size
    slots[pos[None, :] >= torch.tensor(lengths)[:, None]] = 0
    return slots.to(device)


def _build_decode_group(seq_ids: list[int], metadata: AttentionMetadata, starts: list[int],
                        device: torch.device) -> _Group:
    """A decode group in few ops (~10 instead of ~25: about a third of `prepare` at batch 1).

    Key positions past a sequence's length read whatever its last block (or block 0, for
    missing blocks) holds there - finite, since the pool is zero-filled - and are masked.
    When all lengths are equal (always at batch 1) there is nothing to mask: no mask at all.
    """
    bs = metadata.block_size
    clens = [metadata.context_lens[i] for i in seq_ids]
    b, lmax = len(seq_ids), max(clens)
    nblocks = (lmax + bs - 1) // bs
    table = []
    for i, length in zip(seq_ids, clens):
        blocks = metadata.block_tables[i]
        if len(blocks) * bs < length:
            raise ValueError(f"sequence {i}: {len(blocks)} blocks cannot hold {length} tokens "
                             f"(block size {bs})")
        row = blocks[:nblocks]
        table.append(row + [0] * (nblocks - len(row)) if len(row) < nblocks else row)
    table_t = torch.tensor(table, dtype=torch.long)
    slots = _leading((table_t[:, :, None] * bs + torch.arange(bs)).view(b, -1), lmax)
    token_index = torch.tensor([starts[i] for i in seq_ids], dtype=torch.long)
    mask = None
    if min(clens) != lmax:
        mask = (torch.arange(lmax)[None, :] < torch.tensor(clens)[:, None])[:, None, None, :].to(device)
    token_index = token_index.to(device)
    return _Group(True, token_index[:, None], slots.to(device), mask, None, token_index)


def _leading(slots: torch.Tensor, n: int) -> torch.Tensor:
    """slots[:, :n] as a tensor of its own (one ~2 us copy): a compiled decode step guards on its
    inputs' strides and on a view's base, so one layout means one graph (a strided view of the
    memo's table recompiled it: 20 s in the middle of a run)."""
    return slots[:, :n].clone()


@dataclass
class _DecodeMemo:
    """The last decode group's tables and its slots over every allocated block, kept across steps."""

    tables: list[list[int]]  # copies of the block tables it was built from
    token_rows: list[int]
    slots_full: torch.Tensor  # [B, blocks * block_size]
    token_index: torch.Tensor  # [B]


def _memo_decode_group(memo: _DecodeMemo | None, seq_ids: list[int], metadata: AttentionMetadata,
                       starts: list[int], device: torch.device) -> tuple[_Group, _DecodeMemo | None]:
    """A decode group from the previous step's tensors when its sequences and block tables are
    unchanged (15 of 16 steps at block size 16: a step only adds a key position), else rebuilt.

    The slots of every allocated block are kept, and a step takes the first `context_len` of
    them (one copy): the ~10 ops of `_build_decode_group` become 1. Measured at batch 1 on the
    reference model (1 thread, interleaved A/B, 2 runs each): backend prepare 103 -> 43 us,
    the step's prepare 0.26 -> 0.13 ms, host p10 0.35 -> 0.24 ms, 269 -> 326 tok/s.
    Lengths that differ still get their mask each step.
    """
    bs = metadata.block_size
    tables = [metadata.block_tables[i] for i in seq_ids]
    clens = [metadata.context_lens[i] for i in seq_ids]
    rows = [starts[i] for i in seq_ids]
    lmax = max(clens)
    if memo is None or memo.token_rows != rows or memo.tables != tables or lmax > memo.slots_full.shape[1]:
        if any(len(t) * bs < n for t, n in zip(tables, clens)):  # let the builder raise its error
            return _build_decode_group(seq_ids, metadata, starts, device), None
        nblocks = min(len(t) for t in tables)
        table_t = torch.tensor([t[:nblocks] for t in tables], dtype=torch.long)
        slots_full = (table_t[:, :, None] * bs + torch.arange(bs)).view(len(tables), -1).to(device)
        memo = _DecodeMemo([list(t) for t in tables], rows, slots_full,
                           torch.tensor(rows, dtype=torch.long, device=device))
        if lmax > slots_full.shape[1]:  # a sequence shorter in blocks than the longest's length
            return _build_decode_group(seq_ids, metadata, starts, device), None
    mask = None
    if min(clens) != lmax:
        mask = (torch.arange(lmax)[None, :] < torch.tensor(clens)[:, None])[:, None, None, :].to(device)
    ti = memo.token_index
    return _Group(True, ti[:, None], _leading(memo.slots_full, lmax), mask, None, ti), memo


def _build_group(seq_ids: list[int], metadata: AttentionMetadata, starts: list[int],
                 device: torch.device) -> _Group:
    qlens = [metadata.query_lens[i] for i in seq_ids]
    if max(qlens) == 1:
        return _build_decode_group(seq_ids, metadata, starts, device)
    clens = [metadata.context_lens[i] for i in seq_ids]
    b, qmax, lmax = len(seq_ids), max(qlens), max(clens)
    qpos = torch.arange(qmax)
    qlen_t = torch.tensor(qlens)
    start_t = torch.tensor([starts[i] for i in seq_ids])
    real = qpos[None, :] < qlen_t[:, None]  # [B, Qmax]
    token_index = torch.where(real, start_t[:, None] + qpos[None, :], 0)
    out_index = token_index[real]
    valid = None if bool(real.all()) else real.reshape(-1).to(device)
    is_decode = qmax == 1
    if b == 1 and qlens[0] == clens[0] and not is_decode:
        return _Group(False, token_index.to(device), None, None, valid, out_index.to(device),
                      fresh_causal=True, token_start=starts[seq_ids[0]])
    slots = _seq_slots([metadata.block_tables[i] for i in seq_ids], clens, metadata.block_size, device)
    kpos = torch.arange(lmax)
    clen_t = torch.tensor(clens)
    if is_decode:
        mask = (kpos[None, :] < clen_t[:, None])[:, None, None, :]
    else:
        # query i of a chunk sees keys up to context_len - query_len + i; padding rows see
        # every real key (never an empty row, which would give NaN)
        limit = torch.minimum(clen_t[:, None] - qlen_t[:, None] + qpos[None, :] + 1, clen_t[:, None])
        mask = (kpos[None, None, :] < limit[:, :, None])[:, None, :, :]
    return _Group(is_decode, token_index.to(device), slots, mask.to(device), valid,
                  out_index.to(device))


# a padded key position saved is worth splitting a group only past this many (one more
# SDPA call and gather per layer, ~50 us, costs about as much as gathering and reading this
# many key positions of a 3-kv-head, 64-dim model). It was 4096: the 135M model's mixed workload
# (64 prompts of 16-512 tokens) spent its decode steps on gathers and SDPA over padding; at 512 its
# decode forward took 0.88-0.89x the time (A/B twice, 71.3 -> 62.7 s, 58.8 -> 52.3 s)
SPLIT_MIN_SAVING = 512

# compile_decode attends the paged pool in place where it can (paged_decode.py); False: the gather + SDPA
PAGED_DECODE = True
# ... for models whose keys and values of one token in one layer take at least this many bytes. The flex
# template costs ~70 us a call whatever it reads (the reference model, 2 kv heads of 32, batch 1: forward
# 0.40-0.45 -> 0.67-0.79 ms a step, 1837-2029 -> 955-1141 tok/s), about what gathering ~1.5 MB costs, so
# with rows of 512 bytes a batch would need ~3000 tokens of context before reading in place paid; the 135M
# model's 1536-byte rows (3 kv heads of 64) pay at its mixed workload's batches (decode steps 45.7 -> 36.6 s).
# Per model, not per step: batch 1 gathering while larger batches read in place made dynamo recompile the
# step again and again in the middle of the 135M mixed run (its guard on the plan's `paged`, ~100 s each)
PAGED_MIN_ROW_BYTES = 1024
# the KV block size where decodes attend the pool in place and the config leaves it open: the template reads a
# block per tile. One layer's decode attention, 9/3 heads of 64, contexts 100-768
# (engine/benchmarks/paged_decode_blocks.py), ms at blocks of 16 / 32 / 64 / 128: batch 48 1.76-1.95 / 1.42-1.48 /
# 1.22-1.60 / 1.21-1.51, batch 16 0.83 / 0.59 / 0.51 / 0.46. 64, not 128: a sequence's last block is half empty
# on average, and the prefix cache shares whole blocks
PAGED_BLOCK_SIZE = 64


# ... and blocks of at least the template's key tile: below it, on a CPU with AVX2 and no AVX-512 (AMD EPYC),
# blocks of 8 came out wrong (whole outputs off by up to 4.6; 16, 32, 64 exact), so smaller blocks gather
PAGED_MIN_BLOCK_SIZE = 16


def attends_in_place(kv_row_bytes: int, device: torch.device, inductor: bool, block_size: int) -> bool:
    """Do compiled decodes attend the pool in place (paged_decode.py) for KV rows of this size, in these blocks?"""
    return (PAGED_DECODE and inductor and kv_row_bytes >= PAGED_MIN_ROW_BYTES and block_size >= PAGED_MIN_BLOCK_SIZE
            and paged_decode.unavailable_reason(device) is None)


def split_by_length(seq_ids: list[int], lengths: list[int], depth: int = 2) -> list[list[int]]:
    """Split sequences (sorted by key length) where that saves enough padded positions."""
    order = sorted(seq_ids, key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n = len(ls)
    if depth == 0 or n < 2:
        return [order]
    whole = n * ls[-1]
    # group [0, cut) padded to ls[cut - 1], group [cut, n) padded to ls[-1]
    best_cost, cut = min((cut * ls[cut - 1] + (n - cut) * ls[-1], cut) for cut in range(1, n))
    if whole - best_cost < SPLIT_MIN_SAVING:
        return [order]
    return split_by_length(order[:cut], lengths, depth - 1) + split_by_length(order[cut:], lengths, depth - 1)


def plan_groups(metadata: AttentionMetadata, split_decodes: bool = True) -> list[list[int]]:
    """Sequence ids per SDPA call: decodes together (split by context length when padding
    would waste much, unless `split_decodes` is off: then in batch order), each fresh prefill
    (nothing cached before it) alone, other prefills by the power of two of their length."""
    decode, fresh, buckets = [], [], {}
    for i, (q, c) in enumerate(zip(metadata.query_lens, metadata.context_lens)):
        if q == 1:
            decode.append(i)
        elif q == c:
            fresh.append([i])
        else:
            buckets.setdefault((q - 1).bit_length(), []).append(i)
    if not decode:
        groups = []
    else:
        groups = split_by_length(decode, metadata.context_lens) if split_decodes else [decode]
    return groups + fresh + [buckets[k] for k in sorted(buckets)]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    traceable = True  # compile_decode: the whole decode forward is one graph (see model_runner.py)

    def __init__(self):
        # gathered keys/values land in buffers reused across layers and steps: a fresh
        # multi-megabyte tensor per layer costs more in page faults than the copy itself
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._decode_memo: _DecodeMemo | None = None  # see _memo_decode_group
        # compile_decode turns this off (model_runner.py): a compiled decode step is a graph per plan shape,
        # and each group count (2-4) and a scattered row order would be one more, compiled the first time
        # a batch meets it (~10-20 s in the middle of serving). One group in batch order: a length mask
        # or none, batch 1 or more, graphs that the warm-up compiles
        self.split_decodes = True
        self._paged: paged_decode.BlockLists | None = None  # see for_compiled_decode

    @classmethod
    def default_block_size(cls, kv_row_bytes: int, device: torch.device, compiled: bool) -> int:
        if compiled and attends_in_place(kv_row_bytes, device, inductor=True, block_size=PAGED_BLOCK_SIZE):
            return PAGED_BLOCK_SIZE
        return super().default_block_size(kv_row_bytes, device, compiled)

    def for_compiled_decode(self, k_cache: torch.Tensor, inductor: bool) -> None:
        """compile_decode is on: decodes stay one group (split_decodes), and where inductor compiles them,
        its flex attention template runs (PAGED_DECODE, a CPU with AVX2) and the gather it saves is worth
        the template's fixed cost (`PAGED_MIN_ROW_BYTES`), decodes attend the pool in place."""
        self.split_decodes = False
        num_blocks, block_size, kv_heads, head_dim = k_cache.shape
        if attends_in_place(2 * kv_heads * head_dim * k_cache.element_size(), k_cache.device, inductor, block_size):
            self._paged = paged_decode.BlockLists(num_blocks, k_cache.device)

    def activate(self, metadata: AttentionMetadata) -> None:
        plan: _Plan = metadata.scratch[_SCRATCH_KEY]
        if plan.groups[0].paged is not None:
            plan.groups[0].paged.write()

    def _gather_buffers(self, numel: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (like.device, like.dtype)
        bufs = self._buffers.get(key)
        if bufs is None or bufs[0].numel() < numel:
            numel = max(numel, 2 * bufs[0].numel() if bufs else 0)
            bufs = self._buffers[key] = (like.new_empty(numel), like.new_empty(numel))
        return bufs

    def prepare(self, metadata: AttentionMetadata) -> None:
        if _SCRATCH_KEY in metadata.scratch or static_decode.SCRATCH_KEY in metadata.scratch:
            return  # idempotent: the model calls it too, in case the runner did not (a graph's step: no plan)
        device = metadata.slot_mapping.device
        starts, total = [], 0
        for q in metadata.query_lens:
            starts.append(total)
            total += q
        if total != metadata.num_tokens:
            raise ValueError(f"query_lens sum to {total} but slot_mapping has {metadata.num_tokens} tokens")
        seq_groups = plan_groups(metadata, self.split_decodes)
        if len(seq_groups) == 1 and metadata.num_tokens == metadata.num_seqs:  # one decode group
            ids = seq_groups[0]
            group, self._decode_memo = _memo_decode_group(self._decode_memo, ids, metadata, starts, device)
            if self._paged is not None:
                group.paged = self._paged.decode_blocks([metadata.block_tables[i] for i in ids],
                                                        [metadata.context_lens[i] for i in ids],
                                                        metadata.block_size)
            groups = [group]
        else:
            groups = [_build_group(ids, metadata, starts, device) for ids in seq_groups]
        # one group of all sequences in order, none padded: its rows are the output as they are
        identity = (len(groups) == 1 and groups[0].valid is None
                    and seq_groups[0] == list(range(metadata.num_seqs)))
        metadata.scratch[_SCRATCH_KEY] = _Plan(groups, identity)

    def forward(self, q, k, v, k_cache, v_cache, metadata, scale):
        static = metadata.scratch.get(static_decode.SCRATCH_KEY)
        if static is not None:  # a CUDA graph's decode step (engine/core/cuda_graph.py)
            return static_decode.attend(q, k, v, k_cache, v_cache, metadata.slot_mapping, static, scale)
        self.prepare(metadata)
        plan: _Plan = metadata.scratch[_SCRATCH_KEY]
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        group_size = num_heads // num_kv_heads
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, metadata.slot_mapping, k)
        v_flat.index_copy_(0, metadata.slot_mapping, v)

        out = None if plan.identity else q.new_empty(num_tokens, num_heads, head_dim)
        for g in plan.groups:
            rows = self._attend_group(g, q, k, v, k_flat, v_flat, scale, num_kv_heads, group_size,
                                      plan.identity)
            if plan.identity:
                return rows
            if g.valid is not None:
                rows = rows[g.valid]
            out.index_copy_(0, g.out_index, rows)
        return out

    def _gather(self, g: _Group, k_flat, v_flat, num_kv_heads, head_dim, shape):
        """The group's keys and values as [B, KVH, Lmax, D], gathered straight into SDPA's
        contiguous layout (a permuted view would make SDPA copy it again) and into reused
        buffers (fresh ones cost page faults); the buffer views are made by the first layer
        and reused by the others (6 ops a layer)."""
        key = (num_kv_heads, head_dim, k_flat.dtype, k_flat.device)
        views = g.head_rows.get(key)
        if views is None:
            rows = g.kv_rows(num_kv_heads)
            numel = rows.numel() * head_dim
            kbuf, vbuf = self._gather_buffers(numel, k_flat)
            kout, vout = kbuf[:numel].view(-1, head_dim), vbuf[:numel].view(-1, head_dim)
            views = g.head_rows[key] = (rows, kout, vout, kout.view(shape), vout.view(shape))
        rows, kout, vout, ks, vs = views
        torch.index_select(k_flat.view(-1, head_dim), 0, rows, out=kout)
        torch.index_select(v_flat.view(-1, head_dim), 0, rows, out=vout)
        return ks, vs

    def _attend_group(self, g: _Group, q, k, v, k_flat, v_flat, scale, num_kv_heads, group_size,
                      in_order: bool = False):
        """Returns [B * Qmax, num_heads, head_dim] rows in (sequence, query) order.
        `in_order`: the group's rows are the flat batch as it is (no gather of q needed)."""
        num_heads, head_dim = q.shape[1], q.shape[2]
        b, qmax = g.token_index.shape
        if g.fresh_causal:
            # one sequence's tokens lie together in the flat batch: slice, no gather
            rows = slice(g.token_start, g.token_start + qmax)
            qs = q[rows].transpose(0, 1)[None]  # [1, H, Q, D]
            ks = k[rows].transpose(0, 1)[None]
            vs = v[rows].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                               enable_gqa=group_size > 1)
            return o[0].transpose(0, 1)
        if g.paged is not None and torch.compiler.is_compiling():  # the pool in place (paged_decode.py)
            return paged_decode.attend(q if in_order else q[g.out_index], k_flat, v_flat, g.paged, scale)
        shape = (b, num_kv_heads, g.slots.shape[1], head_dim)
        if torch.compiler.is_compiling():  # compile_decode: a plain gather, inductor plans the memory
            # not memoized in the plan: a mutation dynamo would replay after every call of the graph, and
            # a graph with side effects is not replayed directly (engine/core/compiled_replay.py)
            rows = g.kv_rows(num_kv_heads, memo=False)
            ks = k_flat.view(-1, head_dim).index_select(0, rows).view(shape)
            vs = v_flat.view(-1, head_dim).index_select(0, rows).view(shape)
        else:
            ks, vs = self._gather(g, k_flat, v_flat, num_kv_heads, head_dim, shape)
        if g.is_decode:
            # the query heads sharing a kv head act as that head's query rows: no kv repeat
            qs = (q if in_order else q[g.out_index]).view(b, num_kv_heads, group_size, head_dim)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=g.mask, scale=scale)
            return o.reshape(b, num_heads, head_dim)
        qs = q[g.token_index].permute(0, 2, 1, 3)  # [B, H, Qmax, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=g.mask, scale=scale,
                                           enable_gqa=group_size > 1)
        return o.permute(0, 2, 1, 3).reshape(b * qmax, num_heads, head_dim)
