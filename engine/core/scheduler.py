"""The scheduler: the single place that decides what runs in each step.

Continuous batching over two queues. `running` holds sequences that own KV
blocks, in arrival order; `waiting` holds the ones that do not (new, or
preempted). Each step:

1. Running sequences first, oldest first: each gets its remaining tokens (one
   for a decode, the rest of its prompt for a chunked prefill) within the
   token budget. When the pool has no block for one, the newest running
   sequence is preempted by recompute (blocks dropped, back to the front of
   the waiting queue), until the block fits or the sequence itself was the
   newest.
2. Then, if nothing was preempted, waiting sequences in arrival order, while
   the sequence budget, the token budget and the pool allow; a new sequence
   first takes whatever prefix the cache holds. With chunked prefill a prompt
   may take only part of the remaining budget and continue next step (without
   it, only a preempted sequence longer than the whole budget is split).
3. Multi-step decode (engine/core/multi_step.py): when the batch is decodes only,
   nothing waits, and every sequence is greedy with nothing for the host to shape,
   each gets the KV slots of k tokens and the batch runs k steps. K, the most, is
   `num_scheduler_steps` where it is fixed; by default ("auto", None) it is
   clamp(floor(STEP_BUDGET_S / t), 1, K_MAX) with t the measured seconds of one
   decode sub-step at this batch size (`observe_step`, after each step), and K = 1
   is an ordinary step. k is K, or fewer where a sequence has fewer tokens left. It
   is all or none, and only from free blocks: more steps never preempt anyone.

A request that could never run (prompt at least as long as the context, or
longer than the whole pool) is rejected in `check_prompt` before it queues.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.core.kv_cache import KVCacheManager
from engine.core.multi_step import AutoSteps, configured_steps, steps_for
from engine.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens to compute per sequence
    # per sequence: how many of its rows are sampled - 1 when it reaches its last token this step, else 0
    # (a speculator adds the rows of the drafts it verifies)
    samples: list[int] = field(default_factory=list)
    num_decode_seqs: int = 0  # the others are prefills (prompt chunks)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Sequence] = field(default_factory=list)
    # first time ever scheduled: the scheduler stamps their scheduled_time
    newly_scheduled: list[Sequence] = field(default_factory=list)
    # the step's admissions: prompt tokens looked up in the prefix cache, and those it served (their one count:
    # totals are sums over steps)
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_steps: int = 1  # decode steps this batch runs (multi-step decode: engine/core/multi_step.py)
    stepped: bool = False  # greedy decodes the runner chooses on its own (multi-step), one step or more

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.samples.append(seq.num_computed_tokens + num_new_tokens == len(seq.token_ids))  # a bool: 1 or 0
        # a decode computes exactly the one token sampled last step
        if num_new_tokens == 1 and seq.num_output_tokens > 0 and seq.num_uncomputed_tokens == 1:
            self.num_decode_seqs += 1
            self.num_decode_tokens += 1
        else:
            self.num_prefill_tokens += num_new_tokens


class Scheduler:
    def __init__(self, kv_cache: KVCacheManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, enable_chunked_prefill: bool = True, num_scheduler_steps: int | None = None):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if num_scheduler_steps is not None and num_scheduler_steps < 1:
            raise ValueError("num_scheduler_steps must be >= 1 (1: one step per schedule) or auto (None), "
                             f"got {num_scheduler_steps}")
        # a fixed K, or None: K by the measured step time (auto_steps)
        self.num_scheduler_steps = num_scheduler_steps
        self.auto_steps = AutoSteps()
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        # the longest a sequence (prompt + output) may grow: an unfinished sequence of length L
        # needs L KV slots; the token that makes it max_seq_len long ends it without one
        pool_tokens = kv_cache.num_blocks * kv_cache.block_size
        self.max_seq_len = min(max_model_len, pool_tokens + 1)
        self.max_model_len = max_model_len
        self.pool_tokens = pool_tokens
        # speculative decoding reserves slots for draft tokens beyond the next one
        self.num_lookahead_tokens = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.total_preemptions = 0

    @classmethod
    def from_config(cls, config, kv_cache: KVCacheManager, max_model_len: int) -> Scheduler:
        """The engine's scheduler: its budgets from the EngineConfig, the context its model allows."""
        return cls(kv_cache, max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                   max_model_len=max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
                   num_scheduler_steps=configured_steps(config))

    # --- admission -----------------------------------------------------------

    def check_prompt(self, num_prompt_tokens: int) -> None:
        """Raise ValueError for a prompt that could never be scheduled."""
        if num_prompt_tokens < 1:
            raise ValueError("the prompt is empty: at least one token is needed")
        if num_prompt_tokens >= self.max_model_len:
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens, but the context is "
                             f"{self.max_model_len} tokens (max_model_len) and must leave room for "
                             "at least one output token")
        if num_prompt_tokens > self.pool_tokens:
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens, more than the whole KV cache "
                             f"holds ({self.kv_cache.num_blocks} blocks x {self.kv_cache.block_size} "
                             "tokens); raise kv_cache_memory_bytes / num_kv_blocks")
        if not self.enable_chunked_prefill and num_prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens; without chunked prefill a "
                             f"prompt must fit in max_num_batched_tokens ({self.max_num_batched_tokens})")

    def add(self, seq: Sequence) -> None:
        self.check_prompt(seq.num_prompt_tokens)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- the decision ----------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        kv = self.kv_cache
        running = self.running

        for seq in running:  # a preemption pops the newest: the loop ends at the last one not preempted
            if budget == 0:
                break
            num_new = min(seq.num_uncomputed_tokens, budget)
            lookahead = min(self.num_lookahead_tokens, budget - num_new) if seq.num_uncomputed_tokens == 1 else 0
            if lookahead and not kv.allocate(seq, num_new + lookahead):
                lookahead = 0  # speculation is optional: never preempt anyone for it
            while not kv.allocate(seq, num_new + lookahead):  # (blocks a sequence holds already: no-op)
                victim = running.pop()  # the newest running sequence
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.add(seq, num_new)
                budget -= num_new + lookahead

        if not batch.preempted:
            # hashes of the blocks the sequences admitted in this step will fill: a waiting sequence whose next
            # block is one of them would compute the same prefix again beside them (32 prompts of one shared
            # prefix admitted together recomputed it ~10 times), so it waits one step and then hits the cache
            filling: set = set()
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs:
                seq = self.waiting[0]
                hit = kv.find_cached_prefix(seq)
                if filling and _next_block_filling(kv, seq, len(hit), filling):
                    break
                computed = len(hit) * kv.block_size
                num_new = len(seq.token_ids) - computed
                if num_new > budget:
                    # without chunked prefill only a preempted sequence that outgrew the whole
                    # budget is split (it could never run otherwise)
                    if not self.enable_chunked_prefill and num_new <= self.max_num_batched_tokens:
                        break
                    num_new = budget
                if not kv.allocate(seq, num_new, hit):
                    break
                self.waiting.popleft()
                batch.prefix_query_tokens += len(seq.token_ids) if kv.enable_prefix_caching else 0
                batch.prefix_hit_tokens += computed
                if seq.scheduled_time == 0.0:
                    seq.scheduled_time = time.time()
                    seq.num_cached_tokens = computed
                    batch.newly_scheduled.append(seq)
                seq.status = SequenceStatus.RUNNING
                running.append(seq)
                batch.add(seq, num_new)
                budget -= num_new
                if kv.enable_prefix_caching:
                    filling.update(kv.prefix_block_hashes(seq, computed + num_new))
        if self.num_scheduler_steps != 1 and not self.waiting and not batch.preempted:
            self._take_steps(batch)
        return batch

    def _take_steps(self, batch: ScheduledBatch) -> None:
        """Step 3: k steps (up to K) for a batch of decodes only, if all of it may take them and the free
        blocks hold every sequence's k slots."""
        if batch.num_decode_seqs < len(batch.seqs):  # a prefill is in it
            return
        most = self.num_scheduler_steps or self.auto_steps.k_for(len(batch.seqs))
        k = steps_for(batch.seqs, most, self.max_seq_len)
        if k == 0:
            return
        kv = self.kv_cache
        needed = sum(max(0, kv.blocks_for(s.num_computed_tokens + k) - len(s.block_table)) for s in batch.seqs)
        if needed > kv.num_free_blocks:
            k = 1  # the one step's slots are allocated already
        for seq in batch.seqs:
            kv.allocate(seq, k)
        batch.num_steps, batch.stepped = k, True

    def observe_step(self, batch: ScheduledBatch, seconds: float) -> None:
        """A step ran `batch` in `seconds` (schedule to postprocess): a pure-decode one's time per sub-step is
        what auto K is chosen by."""
        if self.num_scheduler_steps is None and batch.seqs and batch.num_decode_seqs == len(batch.seqs):
            self.auto_steps.observe(len(batch.seqs), batch.num_steps, seconds)

    def _preempt(self, seq: Sequence) -> None:
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(seq)

    # --- after the step --------------------------------------------------------

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished and free the blocks; `remove_finished` drops it from `running`."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.kv_cache.free(seq)

    def remove_finished(self) -> None:
        self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]

    def abort(self, seq: Sequence) -> None:
        """Take a sequence out wherever it is and free its blocks."""
        if seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        if seq.status is not SequenceStatus.FINISHED:
            self.finish(seq, "abort")


# a sequence waits a step for a prefix being computed only when that saves at least this many tokens of
# prefill: the wait costs it a step of time to first token
MIN_SHARED_TOKENS_TO_WAIT = 64


def _next_block_filling(kv: KVCacheManager, seq: Sequence, num_hit_blocks: int, filling: set) -> bool:
    """Do the blocks of `seq` past its cache hit begin with MIN_SHARED_TOKENS_TO_WAIT tokens that sequences in
    this step are filling?"""
    if seq.wants_prompt_logprobs:  # it never takes a cache hit: nothing to wait for
        return False
    wait_blocks = kv.blocks_for(MIN_SHARED_TOKENS_TO_WAIT)
    ahead = kv.prefix_block_hashes(seq, len(seq.token_ids))[num_hit_blocks:num_hit_blocks + wait_blocks]
    return len(ahead) == wait_blocks and all(h in filling for h in ahead)
