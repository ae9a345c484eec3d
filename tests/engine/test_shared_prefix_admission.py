"""Sequences that share a prefix are not admitted beside the one computing it: they wait a step and hit it."""

from __future__ import annotations

from engine.core.kv_cache import KVCacheManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence


def _scheduler() -> Scheduler:
    return Scheduler(KVCacheManager(256, 4), max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=1024,
                     enable_chunked_prefill=True)


def _seq(rid: str, tokens: list[int], **params) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(temperature=0.0, **params), 0.0)


def _step(sched: Scheduler):
    batch = sched.schedule()
    for s, n, samples in zip(batch.seqs, batch.num_new_tokens, batch.samples):
        s.num_computed_tokens += n
        sched.kv_cache.cache_full_blocks(s)
        if samples:
            s.token_ids.append(7)
    return batch


def test_a_shared_prefix_is_computed_once_and_hit_by_the_others():
    sched = _scheduler()
    shared = list(range(100, 164))  # 16 full blocks of 4: 64 tokens, enough to wait a step for
    for i in range(4):
        sched.add(_seq(str(i), shared + [i, i + 1]))
    first = _step(sched)
    assert [s.request_id for s in first.seqs] == ["0"]  # the others would compute the same 4 blocks beside it
    second = _step(sched)
    assert sorted(s.request_id for s in second.seqs if s.request_id != "0") == ["1", "2", "3"]
    assert second.prefix_hit_tokens == 3 * 64
    hits, queries = (sum(getattr(b, f) for b in (first, second)) for f in ("prefix_hit_tokens", "prefix_query_tokens"))
    assert hits == 3 * 64 and queries == 4 * 66


def test_a_short_shared_prefix_is_not_worth_a_step_of_waiting():
    sched = _scheduler()
    for i in range(4):
        sched.add(_seq(str(i), list(range(100, 160)) + [i]))  # 15 blocks: 60 tokens
    assert len(_step(sched).seqs) == 4


def test_prompts_without_a_common_block_are_admitted_together():
    sched = _scheduler()
    for i in range(4):
        sched.add(_seq(str(i), list(range(1000 * i, 1000 * i + 18))))
    assert len(_step(sched).seqs) == 4


def test_a_sequence_that_cannot_take_a_hit_does_not_wait_for_one():
    sched = _scheduler()
    shared = list(range(100, 164))
    sched.add(_seq("0", shared + [1]))
    sched.add(_seq("1", shared + [2], prompt_logprobs=1))
    assert len(_step(sched).seqs) == 2
