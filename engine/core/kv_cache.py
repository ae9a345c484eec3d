"""The KV block pool: fixed-size blocks, reference counts, prefix caching, LRU eviction.

The pool only does bookkeeping; the tensors themselves live in the model
runner (`[num_blocks, block_size, num_kv_heads, head_dim]` per layer), indexed
by the block ids handed out here.

Prefix caching: once a block is full of computed tokens it gets a hash chained
over everything before it (hash(parent hash, its tokens)), so equal hashes mean
equal prefixes. A new request walks its prompt block by block and reuses blocks
whose hash matches - after checking the block really holds the same tokens
and the same parent, so even a hash collision cannot serve wrong keys/values.
When its last user finishes, a hashed block is not wiped: it stays "cached"
(free, but reusable) until a new allocation needs the space; the least
recently used cached block goes first. Blocks with no hash are always handed
out before cached ones.

Counts (exact at any moment): used = referenced by at least one sequence;
free = not referenced (includes cached); cached = free and still holding a
reusable prefix. Counter: evictions (cumulative). A step's prefix queries and hits are counted on
its batch (ScheduledBatch.prefix_query_tokens / prefix_hit_tokens), which admits the sequences.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Callable

from engine.core.sequence import Sequence

BlockHash = bytes
HashFn = Callable[[BlockHash | None, tuple[int, ...]], BlockHash]

# the KV pool's memory when EngineConfig.kv_cache_memory_bytes is not given, at most: see kv_pool_blocks
DEFAULT_KV_CACHE_MEMORY_BYTES = 256 * 1024**2


def kv_pool_blocks(bytes_per_block: int, block_size: int, max_num_seqs: int, max_model_len: int,
                   budget_bytes: int | None = None, num_kv_blocks: int | None = None) -> int:
    """How many KV blocks the pool gets: `num_kv_blocks` when given, else what `budget_bytes` holds when
    given, else what max_num_seqs sequences of max_model_len tokens can ever hold at once (one block more
    each, for speculative lookahead slots), capped by DEFAULT_KV_CACHE_MEMORY_BYTES. The zero-filled pool is
    resident from start, so a fixed default larger than the scheduler can fill is RSS for nothing (the
    reference model: 256 MiB where 64 x 256 tokens need 34 MiB)."""
    if num_kv_blocks:
        return num_kv_blocks
    if budget_bytes is not None:
        return budget_bytes // bytes_per_block
    fill = max_num_seqs * (-(-max_model_len // block_size) + 1)
    return min(DEFAULT_KV_CACHE_MEMORY_BYTES // bytes_per_block, fill)


def hash_block(parent: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """Chained block hash: 16 bytes of BLAKE2b over the parent's hash and the tokens."""
    h = hashlib.blake2b(parent or b"root", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        # set while the block holds a registered, reusable prefix
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None
        self.token_ids: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hashed={self.block_hash is not None})"


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: HashFn = hash_block):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self._hash_to_block: dict[BlockHash, int] = {}
        self.evictions = 0  # cumulative (the engine reports per-step differences)

    # --- counts --------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._free_cached)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache --------------------------------------------------------

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of the first `num_blocks` full blocks of `seq` (memoised on it)."""
        hashes, bs = seq.block_hashes, self.block_size
        for i in range(len(hashes), num_blocks):
            hashes.append(self.hash_fn(hashes[-1] if i else None, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
        return hashes

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of `seq`'s tokens (read only).

        At least one token is always left to compute, because the last one's
        logits are needed. Each hit is verified against the tokens and parent.
        """
        if not self.enable_prefix_caching or seq.wants_prompt_logprobs:
            return []
        hashes = self.prefix_block_hashes(seq, len(seq.token_ids))
        bs, hit = self.block_size, []
        for i, block_hash in enumerate(hashes):
            block_id = self._hash_to_block.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            parent = hashes[i - 1] if i else None
            if block.parent_hash != parent or block.token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break  # a hash collision: never serve someone else's keys
            hit.append(block_id)
        return hit

    def prefix_block_hashes(self, seq: Sequence, num_tokens: int) -> list[BlockHash]:
        """The chained hashes of the full blocks within `seq`'s first `num_tokens` tokens that a later
        sequence could hit (never the block of its last prompt token: see find_cached_prefix)."""
        return self._block_hashes(seq, min(num_tokens, len(seq.token_ids) - 1) // self.block_size)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks `seq` has filled with computed tokens since the last call, so others can reuse them."""
        num_full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= seq.num_registered_blocks:
            return
        bs = self.block_size
        hashes = self._block_hashes(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and hashes[i] not in self._hash_to_block:
                block.block_hash = hashes[i]
                block.parent_hash = hashes[i - 1] if i else None
                block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                self._hash_to_block[hashes[i]] = block.block_id
        seq.num_registered_blocks = num_full

    # --- allocation ----------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached_prefix: list[int] = ()) -> bool:
        computed = len(cached_prefix) * self.block_size if cached_prefix else seq.num_computed_tokens
        have = len(seq.block_table) + len(cached_prefix)
        needed = max(0, self.blocks_for(computed + num_new_tokens) - have)
        # cached hits that sit in the free list stop being free once taken
        revived = sum(1 for b in cached_prefix if self.blocks[b].ref_count == 0)
        return needed + revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_prefix: list[int] = ()) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens (after taking `cached_prefix`).

        Returns False and changes nothing when the pool cannot hold them.
        `cached_prefix` (from `find_cached_prefix`) is only valid for a
        sequence with no blocks yet.
        """
        if not self.can_allocate(seq, num_new_tokens, cached_prefix):
            return False
        if cached_prefix:
            assert not seq.block_table, "a prefix hit applies to a sequence without blocks"
            for block_id in cached_prefix:
                self._take(block_id)
            seq.block_table.extend(cached_prefix)
            seq.num_computed_tokens = len(cached_prefix) * self.block_size
            seq.num_registered_blocks = len(cached_prefix)
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        seq.block_table.extend(self._pop_free() for _ in range(needed))
        return True

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; its hashed blocks stay reusable until evicted."""
        self._release(seq.block_table)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def compute_all_but_last(self, seq: Sequence) -> None:
        """After a step that appended several tokens (accepted drafts, multi-step sub-steps): every token of
        `seq` but its last has its KV; the blocks past them go back (a rejected draft's slots, the lookahead),
        and the full ones are registered."""
        seq.num_computed_tokens = len(seq.token_ids) - 1
        keep = self.blocks_for(seq.num_computed_tokens)
        rolled_back = seq.block_table[keep:]
        assert all(self.blocks[b].ref_count == 1 and self.blocks[b].block_hash is None for b in rolled_back), \
            f"rolled back into a shared block of {seq}"
        self._release(rolled_back)
        del seq.block_table[keep:]
        self.cache_full_blocks(seq)

    def _release(self, block_ids: list[int]) -> None:
        """One reference fewer on each block; a block nobody holds goes back to the free lists, a hashed one as
        cached. Last block first, so that a prefix's tail is evicted before its head."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"double free of {block}"
            if block.ref_count == 0:
                if block.block_hash is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_uncached.append(block_id)

    def _take(self, block_id: int) -> None:
        """Add a reference to a cached block (reviving it from the free list if needed)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free_cached[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        if self._free_uncached:
            block_id = self._free_uncached.popleft()
        else:  # evict the least recently used cached block
            block_id = self._forget_oldest_cached()
            self.evictions += 1
        self.blocks[block_id].ref_count = 1
        return block_id

    def reset_prefix_cache(self) -> int:
        """Forget every cached (free) prefix; returns how many blocks were dropped."""
        dropped = len(self._free_cached)
        while self._free_cached:
            self._free_uncached.append(self._forget_oldest_cached())
        return dropped

    def _forget_oldest_cached(self) -> int:
        """Take the least recently used cached block off the cached list and forget its prefix; its id."""
        block_id, _ = self._free_cached.popitem(last=False)
        block = self.blocks[block_id]
        del self._hash_to_block[block.block_hash]
        block.block_hash, block.parent_hash, block.token_ids = None, None, ()
        return block_id

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (tests and debugging)."""
        free_ids = set(self._free_uncached) | set(self._free_cached)
        assert len(free_ids) == self.num_free_blocks, "a block is free twice"
        for block in self.blocks:
            assert (block.ref_count == 0) == (block.block_id in free_ids), block
            if block.block_id in self._free_cached:
                assert block.block_hash is not None, block
            if block.block_hash is not None:
                assert self._hash_to_block.get(block.block_hash) == block.block_id, block
                assert len(block.token_ids) == self.block_size
                assert self.hash_fn(block.parent_hash, block.token_ids) == block.block_hash
        assert len(self._hash_to_block) == sum(b.block_hash is not None for b in self.blocks)
