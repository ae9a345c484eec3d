"""Multi-step decode: K decode steps for one schedule (EngineConfig.num_scheduler_steps: "auto", the default,
or a fixed K as vLLM's --num-scheduler-steps; 1 is off).

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

How many steps at most (K), by default (`num_scheduler_steps` None, "auto": `AutoSteps`):
  K = clamp(floor(STEP_BUDGET_S / t), 1, K_MAX)
where t is the measured wall time of one decode sub-step for batches of this size class (sizes 1, 2-3, 4-7,
...): the smallest of its last WINDOW pure-decode steps, each step's seconds from its schedule to its
postprocess's end over the sub-steps it ran. The smallest, not a mean: on a loaded host most steps are
stretched 2-5x by the OS taking the core away, which is no cost of the step's own and which a mean would
read as a slow step, turning multi-step off where the host's CPU is scarcest; the window still follows a
step that became slower (longer contexts) within WINDOW steps. A size class not
measured yet takes one step, which measures it. K = 1 is an ordinary step (the sampler's path); K >= 2 is
then capped by `steps_for` as a fixed K is. So the host's work between forwards is spread over K tokens
where a step is short, and where it is long (a 135M model's ~25 ms) a batch takes one step, as without
multi-step: the host's share only matters when the step is short. A schedule's K sub-steps take about
STEP_BUDGET_S together, which bounds what multi-step adds to a waiting request's delay and to the gap
between a streaming client's token groups. A fixed K (an int) keeps K whatever the step time.

What it costs: a request that arrives during the K steps waits for them (K forwards; K steps are taken
only when nothing waits at schedule time). The client gets tokens K at a time: each token's time is when
its K arrived, because that is when the client sees it. The telemetry has one StepRecord per sub-step:
the schedule and prepare go on the first, the postprocess on the last, each its own forward time.
"""

from __future__ import annotations

from collections import deque

from engine.core.logits_processors import needs_raw_processing
from engine.core.sequence import Sequence

# the most a schedule's sub-steps take together, by measured sub-step time: vLLM's multi-step users ran K = 8-10
# at 10-30 ms a step (100-300 ms bursts); here K is as many as fit in a few ms (README, "Defaults and why")
STEP_BUDGET_S = 0.004
K_MAX = 16  # where the reference model's batch-1 gain per token flattens (README, "Decode paths, measured")
WINDOW = 16  # the recent pure-decode steps of a size class whose fastest sub-step is t


def configured_steps(config) -> int | None:
    """The engine's K from its EngineConfig: a fixed K, or None for auto. Auto is off (1) beside speculative
    decoding (its steps put several tokens in already) and CUDA graphs (a multi-step batch does not replay
    them, and no GPU step time has been measured against them)."""
    k = config.num_scheduler_steps
    if k is None and (config.speculative_mode not in ("none", "", None) or config.cuda_graphs):
        return 1
    return k


class AutoSteps:
    """num_scheduler_steps "auto": K per schedule from the measured time of a decode sub-step (see the module's
    docstring), per batch-size class."""

    def __init__(self, budget_s: float = STEP_BUDGET_S, k_max: int = K_MAX):
        self.budget_s = budget_s
        self.k_max = k_max
        self.recent_s: dict[int, deque[float]] = {}  # size class -> seconds of one decode sub-step, last WINDOW steps

    @staticmethod
    def size_class(num_seqs: int) -> int:
        return num_seqs.bit_length()  # 1 | 2-3 | 4-7 | 8-15 ...

    def observe(self, num_seqs: int, num_steps: int, seconds: float) -> None:
        """A pure-decode step of `num_seqs` sequences ran `num_steps` sub-steps in `seconds` (host included)."""
        self.recent_s.setdefault(self.size_class(num_seqs), deque(maxlen=WINDOW)).append(seconds / num_steps)

    def k_for(self, num_seqs: int) -> int:
        """K for a decode batch of `num_seqs` sequences now: 1 until its size class has been measured."""
        recent = self.recent_s.get(self.size_class(num_seqs))
        if not recent:
            return 1
        return max(1, min(self.k_max, int(self.budget_s / min(recent))))


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
