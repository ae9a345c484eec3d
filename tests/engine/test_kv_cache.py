"""The KV block pool: counts, prefix hits (verified), LRU eviction, and no leaks (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_cache import KVCacheManager
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence


def make_seq(tokens, rid="r", **params) -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(**params), 0.0)


def compute(kv: KVCacheManager, seq: Sequence, num_new: int, hit=()) -> None:
    """What the engine does: take blocks, run the forward (here: nothing), register full blocks."""
    assert kv.allocate(seq, num_new, list(hit))
    seq.num_computed_tokens += num_new
    kv.cache_full_blocks(seq)


def test_counts_follow_allocation_and_free():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    seq = make_seq(range(10))
    compute(kv, seq, 10)
    assert len(seq.block_table) == 3
    assert (kv.num_used_blocks, kv.num_free_blocks, kv.num_cached_blocks) == (3, 5, 0)
    kv.free(seq)
    # the two full blocks stay reusable, the partial one does not
    assert (kv.num_used_blocks, kv.num_free_blocks, kv.num_cached_blocks) == (0, 8, 2)
    kv.check_invariants()


def test_allocation_fails_without_changing_anything_when_the_pool_is_full():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    seq = make_seq(range(12))
    assert not kv.allocate(seq, 12)
    assert seq.block_table == [] and kv.num_free_blocks == 2


def test_prefix_hit_reuses_blocks_and_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = make_seq(list(range(10)), "a")
    compute(kv, a, 10)
    b = make_seq(list(range(8)) + [99, 98], "b")
    hit = kv.find_cached_prefix(b)
    assert hit == a.block_table[:2]
    compute(kv, b, 2, hit)
    assert b.num_computed_tokens == 10
    assert kv.blocks[hit[0]].ref_count == 2
    # a prompt that is exactly two cached blocks still computes its last token itself
    c = make_seq(list(range(8)), "c")
    assert kv.find_cached_prefix(c) == a.block_table[:1]
    kv.check_invariants()


def test_a_cached_free_block_is_revived_on_a_hit():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], "a")
    compute(kv, a, 5)
    kv.free(a)
    assert kv.num_cached_blocks == 2
    b = make_seq([1, 2, 3, 4, 6], "b")
    hit = kv.find_cached_prefix(b)
    assert len(hit) == 2
    assert kv.can_allocate(b, 1, hit)
    compute(kv, b, 1, hit)
    assert kv.num_cached_blocks == 0 and kv.num_used_blocks == 3
    kv.check_invariants()


def test_hits_are_verified_against_the_tokens_even_when_hashes_collide():
    kv = KVCacheManager(num_blocks=8, block_size=4, hash_fn=lambda parent, tokens: b"same")
    a = make_seq([1, 2, 3, 4, 5], "a")
    compute(kv, a, 5)
    b = make_seq([7, 7, 7, 7, 5], "b")  # same (colliding) hash, different tokens
    assert kv.find_cached_prefix(b) == []
    c = make_seq([1, 2, 3, 4, 9], "c")
    assert kv.find_cached_prefix(c) == a.block_table[:1]


def test_lru_eviction_takes_uncached_blocks_first_then_the_oldest_tail():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4], "a")
    compute(kv, a, 4)
    head, tail = a.block_table
    kv.free(a)  # tail freed first, so the tail is the least recently used
    assert kv.num_cached_blocks == 2 and kv.evictions == 0
    b = make_seq([9, 9, 9, 9], "b")
    compute(kv, b, 4)  # two uncached blocks exist: no eviction yet
    assert kv.evictions == 0 and tail not in b.block_table
    c = make_seq([8, 8], "c")
    compute(kv, c, 2)  # now one cached block must go: a's tail
    assert kv.evictions == 1 and c.block_table == [tail]
    d = make_seq([1, 2, 3, 4, 5], "d")
    assert kv.find_cached_prefix(d) == [head]  # a's head block survived
    kv.check_invariants()


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = make_seq([1, 2, 3, 4, 5], "a")
    compute(kv, a, 5)
    kv.free(a)
    assert kv.num_cached_blocks == 0
    assert kv.find_cached_prefix(make_seq([1, 2, 3, 4, 5], "b")) == []


def test_prompt_logprobs_requests_skip_the_cache():
    kv = KVCacheManager(num_blocks=8, block_size=2)
    compute(kv, make_seq([1, 2, 3, 4, 5], "a"), 5)
    assert kv.find_cached_prefix(make_seq([1, 2, 3, 4, 5], "b", prompt_logprobs=0)) == []


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=0, block_size=4)
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=4, block_size=0)


# --- property tests ------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 2), min_size=1, max_size=14)),
        st.tuples(st.just("decode"), st.integers(0, 50), st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.integers(1, 4), num_blocks=st.integers(1, 12), caching=st.booleans())
def test_blocks_never_leak_and_every_hit_holds_the_right_tokens(ops, block_size, num_blocks, caching):
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=caching)
    # ground truth: the token prefix whose keys/values each block really holds
    content: dict[int, tuple[int, ...]] = {}
    live: list[Sequence] = []

    def run(seq, num_new, hit=()):
        if not kv.allocate(seq, num_new, list(hit)):
            return False
        for i, block_id in enumerate(hit):
            assert content[block_id] == tuple(seq.token_ids[:(i + 1) * block_size]), "a wrong prefix hit"
        start = seq.num_computed_tokens
        seq.num_computed_tokens += num_new
        for pos in range(start, seq.num_computed_tokens):
            content[seq.block_table[pos // block_size]] = tuple(seq.token_ids[:pos + 1])
        kv.cache_full_blocks(seq)
        return True

    for n, op in enumerate(ops):
        if op[0] == "add":
            seq = make_seq(op[1], str(n))
            hit = kv.find_cached_prefix(seq)
            if run(seq, len(seq.token_ids) - len(hit) * block_size, hit):
                live.append(seq)
        elif op[0] == "decode" and live:
            seq = live[op[1] % len(live)]
            seq.token_ids.append(op[2])
            if not run(seq, 1):
                seq.token_ids.pop()
        elif op[0] == "free" and live:
            kv.free(live.pop(op[1] % len(live)))
        kv.check_invariants()
        assert kv.num_used_blocks + kv.num_free_blocks == num_blocks
        assert kv.num_used_blocks == len({b for s in live for b in s.block_table})
        for block in kv.blocks:
            assert block.ref_count == sum(s.block_table.count(block.block_id) for s in live)
    for seq in live:
        kv.free(seq)
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == num_blocks
