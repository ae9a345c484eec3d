"""The scheduler without a model: FCFS, budgets, chunked prefill, preemption, abort, admission."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.engine_records import step_phase
from engine.core.kv_cache import KVCacheManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_tokens=64, chunked=True,
                   max_model_len=1024, caching=True) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
    return Scheduler(kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens,
                     max_model_len=max_model_len, enable_chunked_prefill=chunked)


def seq(rid, n, start=0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(temperature=0.0), 0.0)


def run_step(sched: Scheduler, token: int = 7):
    """What the engine does after the forward: advance, register blocks, append sampled tokens."""
    batch = sched.schedule()
    for s, n, samples in zip(batch.seqs, batch.num_new_tokens, batch.samples):
        s.num_computed_tokens += n
        sched.kv_cache.cache_full_blocks(s)
        if samples:
            s.token_ids.append(token)
    return batch


def test_fcfs_within_the_sequence_budget():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add(seq(str(i), 5))
    batch = run_step(sched)
    assert [s.request_id for s in batch.seqs] == ["0", "1"]
    assert step_phase(batch) == "prefill" and batch.num_prefill_tokens == 10
    assert [s.request_id for s in sched.waiting] == ["2"]
    batch = run_step(sched)
    assert step_phase(batch) == "decode" and batch.num_decode_tokens == 2


def test_chunked_prefill_splits_a_prompt_across_steps_under_the_token_budget():
    sched = make_scheduler(max_tokens=8)
    a = seq("a", 20)
    sched.add(a)
    b1 = run_step(sched)
    assert b1.num_new_tokens == [8] and b1.samples == [False]
    b2 = run_step(sched)
    assert b2.num_new_tokens == [8] and b2.samples == [False]
    b3 = run_step(sched)
    assert b3.num_new_tokens == [4] and b3.samples == [True]
    assert a.num_output_tokens == 1


def test_a_decode_and_a_prefill_chunk_share_a_step():
    sched = make_scheduler(max_tokens=6)
    sched.add(seq("a", 3))
    run_step(sched)
    sched.add(seq("b", 10, start=100))
    batch = run_step(sched)
    assert step_phase(batch) == "mixed"
    assert batch.num_new_tokens == [1, 5] and batch.samples == [True, False]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    sched = make_scheduler(max_tokens=8, chunked=False)
    sched.add(seq("a", 3))
    sched.add(seq("b", 8, start=50))
    batch = run_step(sched)
    assert [s.request_id for s in batch.seqs] == ["a"]  # b (8) does not fit after a (3)
    batch = run_step(sched)
    assert [s.request_id for s in batch.seqs] == ["a"]  # a decode (1) + b (8) > 8
    assert sched.num_waiting == 1


def test_preemption_by_recompute_when_blocks_run_out():
    sched = make_scheduler(num_blocks=4, block_size=2)
    a, b = seq("a", 4), seq("b", 4, start=10)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # a and b each take 2 blocks (4 tokens) and sample a 5th
    batch = run_step(sched)  # each needs a third block: b (the newest) is preempted
    assert batch.preempted == [b]
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert sched.waiting[0] is b and b.num_preemptions == 1 and sched.total_preemptions == 1
    assert sched.kv_cache.num_used_blocks == 3
    sched.finish(a, "length")
    sched.remove_finished()
    batch = run_step(sched)  # b comes back: prompt + its one output recomputed
    assert batch.seqs == [b] and b.num_computed_tokens == 5
    # a's third block evicted b's tail; b's head block was still cached. b's new blocks: a's
    # uncached partial block, then a's least recently used cached block (its tail)
    assert batch.prefix_hit_tokens == 2 and sched.kv_cache.evictions == 2


def test_abort_frees_blocks_wherever_the_sequence_is():
    sched = make_scheduler()
    a, b = seq("a", 9), seq("b", 9, start=30)
    sched.add(a)
    run_step(sched)
    sched.add(b)
    sched.abort(b)
    sched.abort(a)
    sched.remove_finished()
    assert not sched.has_unfinished()
    assert a.finish_reason == "abort" and b.finish_reason == "abort"
    assert sched.kv_cache.num_used_blocks == 0


@pytest.mark.parametrize("n, kwargs, match", [
    (0, {}, "empty"),
    (100, dict(max_model_len=100), "context"),
    (41, dict(num_blocks=10, block_size=4), "KV cache"),
    (17, dict(chunked=False, max_tokens=16), "max_num_batched_tokens"),
])
def test_requests_that_can_never_run_are_rejected_at_admission(n, kwargs, match):
    sched = make_scheduler(**kwargs)
    with pytest.raises(ValueError, match=match):
        sched.add(seq("x", n))
    assert not sched.has_unfinished()


def test_a_sequence_stops_growing_at_the_pool_size():
    sched = make_scheduler(num_blocks=3, block_size=2)
    assert sched.max_seq_len == 7  # 6 slots; the 7th token ends it without needing one


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.integers(1, 20), min_size=1, max_size=8), outputs=st.integers(1, 12),
       num_blocks=st.integers(6, 30), max_tokens=st.integers(1, 24), caching=st.booleans(),
       chunked=st.booleans(), abort_at=st.integers(0, 40))
def test_every_request_finishes_and_no_block_leaks(prompts, outputs, num_blocks, max_tokens, caching, chunked,
                                                   abort_at):
    sched = make_scheduler(num_blocks=num_blocks, block_size=2, max_num_seqs=3, max_tokens=max_tokens,
                           caching=caching, chunked=chunked)
    seqs = []
    for i, n in enumerate(prompts):
        s = seq(str(i), n, start=i % 2)  # two families of shared prefixes
        try:
            sched.add(s)
            seqs.append(s)
        except ValueError:
            pass
    for step in range(2000):
        if not sched.has_unfinished():
            break
        if step == abort_at and seqs:
            sched.abort(seqs[0])
        run_step(sched)
        for s in list(sched.running):
            if s.num_output_tokens >= outputs or len(s.token_ids) >= sched.max_seq_len:
                sched.finish(s, "length")
        sched.remove_finished()
        sched.kv_cache.check_invariants()
    assert not sched.has_unfinished(), "the scheduler got stuck"
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)
    assert sched.kv_cache.num_used_blocks == 0
    assert sched.kv_cache.num_free_blocks == num_blocks
