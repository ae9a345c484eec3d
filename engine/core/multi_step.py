"""Multi-step decode: K decode steps for one schedule (EngineConfig.num_scheduler_steps = K, as vLLM's
--num-scheduler-steps).

At small batch a decode step's host work (schedule, prepare, postprocess, telemetry) costs about as much
as its forward: on the reference model at batch 1 a compiled forward is ~0.23 ms and the rest of the
step ~0.25 ms. When a batch is decodes only and nothing waits, the scheduler gives every sequence the
KV slots of K tokens and the runner computes K tokens per sequence back to back. Each sub-step's input
is the token the one before chose (the argmax, on the device: no trip through the scheduler, the
sampler or the detokenizer), so that host work is paid once per K tokens.

How many steps a batch takes (`steps_for`):
- only sequences whose next tokens the host does not shape: greedy, no logits processors (bias,
  penalties, a grammar), no top-n logprobs. The sampled token's raw logprob is still computed, by the
  sampler's own function. One sequence that is not, and the batch takes an ordinary step;
- up to K, and no more than the fewest tokens any sequence has left before max_tokens and the context's
  end, so nothing is computed past where a sequence must stop. The sequence nearest its end finishes
  on the last sub-step and the batch goes on with K again: a batch that fell back to one step whenever
  any of its requests was within K - 1 tokens of its end would, under steady traffic (one request or
  another always near its end), almost never take more than one.
Such a batch runs on the multi-step path even when it takes one step (a sequence with one token left, or
too few free blocks for more), so that one compiled function serves all its steps: the one-step
path's own graphs would compile in the middle of serving, the first time a batch shape meets them.
A stop token or stop string inside the K ends the sequence there. The tokens after it are dropped, and
their KV slots go with the sequence. The K tokens reach the engine as one StepResult (engine/core/step_result.py),
K per sequence, appended by the same postprocess as every other step's.

What it costs: a request that arrives during the K steps waits for them (K forwards; K steps are taken
only when nothing waits at schedule time). The client gets tokens K at a time: each token's time is when
its K arrived, because that is when the client sees it. The telemetry has one StepRecord per sub-step:
the schedule and prepare go on the first, the postprocess on the last, each its own forward time.
"""

from __future__ import annotations

from engine.core.logits_processors import needs_raw_processing
from engine.core.sequence import Sequence


def host_free(seq: Sequence) -> bool:
    """Can this sequence's next tokens be chosen without the host between them?"""
    p = seq.sampling_params
    return p.greedy and p.logprobs is None and not needs_raw_processing(p) and seq.grammar is None


def tokens_left(seq: Sequence, max_seq_len: int) -> int:
    """How many more tokens it may generate: up to max_tokens, and up to the longest a sequence may be."""
    return min(seq.sampling_params.max_tokens - seq.num_output_tokens, max_seq_len - len(seq.token_ids))


def steps_for(seqs: list[Sequence], k: int, max_seq_len: int) -> int:
    """How many decode steps these decodes may take now, at most k; 0 where the host must choose their
    tokens (see the module's docstring)."""
    if k < 2 or not all(host_free(s) for s in seqs):
        return 0
    return max(1, min(k, *(tokens_left(s, max_seq_len) for s in seqs)))
