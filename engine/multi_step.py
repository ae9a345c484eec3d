"""Multi-step decode: K decode steps for one schedule (EngineConfig.num_scheduler_steps = K, as vLLM's
--num-scheduler-steps).

At small batch a decode step's host work (schedule, prepare, postprocess, telemetry) costs about as much
as its forward: on the reference model at batch 1 a compiled forward is ~0.23 ms and the rest of the
step ~0.25 ms. When a batch is decodes only and nothing waits, the scheduler gives every sequence the
KV slots of K tokens and the runner computes K tokens per sequence back to back. Each sub-step's input
is the token the one before chose (the argmax, on the device: no trip through the scheduler, the
sampler or the detokenizer), so that host work is paid once per K tokens.

Who may take K steps (`takes_steps`):
- a sequence whose next tokens the host does not shape: greedy, no logits processors (bias, penalties,
  a grammar), no top-n logprobs. The sampled token's raw logprob is still computed, by the sampler's
  own function;
- with at least K tokens left before max_tokens and the context's end, so nothing is computed past
  where it must stop. The last few tokens of a request go one step at a time.
A stop token or stop string inside the K ends the sequence there. The tokens after it are dropped, and
their KV slots go with the sequence.

What it costs: a request that arrives during the K steps waits for them (K forwards; K steps are taken
only when nothing waits at schedule time). The client gets tokens K at a time: each token's time is when
its K arrived, because that is when the client sees it. The telemetry has one StepRecord per sub-step:
the schedule and prepare go on the first, the postprocess on the last, each its own forward time.
"""

from __future__ import annotations

from engine.logits_processors import needs_raw_processing
from engine.sequence import Sequence


def host_free(seq: Sequence) -> bool:
    """Can this sequence's next tokens be chosen without the host between them?"""
    p = seq.sampling_params
    return p.greedy and p.logprobs is None and not needs_raw_processing(p) and getattr(seq, "grammar", None) is None


def tokens_left(seq: Sequence, max_seq_len: int) -> int:
    """How many more tokens it may generate: up to max_tokens, and up to the longest a sequence may be."""
    return min(seq.sampling_params.max_tokens - seq.num_output_tokens, max_seq_len - len(seq.token_ids))


def takes_steps(seqs: list[Sequence], k: int, max_seq_len: int) -> bool:
    """Whether these decodes may take k steps now (see the module's docstring)."""
    return k > 1 and all(host_free(s) and tokens_left(s, max_seq_len) >= k for s in seqs)
