"""What one engine step computed for its sampling sequences, whichever path computed it.

The sampler (one token per row), the speculator (accepted drafts and one more) and multi-step decode
(K greedy tokens per row) all hand the engine this one shape: per sampling sequence, in batch order,
the tokens to append, each token's raw logprob (the model's log-softmax, before any processor), the
top-n logprobs where the request asked, and the rows that failed on their own. The engine's
postprocess appends them; nothing else writes a sequence's tokens or logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.outputs import TokenLogprob


@dataclass
class StepResult:
    token_ids: list[list[int]]  # per sampling sequence: its tokens, in order
    raw_logprobs: list[list[float]]  # the same shape: each token's raw logprob
    logprobs: list[list[TokenLogprob] | None]  # the same shape where asked, else None
    errors: dict[int, str] = field(default_factory=dict)  # sampling sequences that failed alone -> the error
    # each forward's seconds: one per sub-step of a multi-step batch; empty: one forward, timed by the step
    forward_seconds: list[float] = field(default_factory=list)
    prompt_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # batch index -> [rows, V]
    # per sampling sequence, how many of its tokens the postprocess appended (up to a stop): the telemetry's count
    kept: list[int] = field(init=False)

    def __post_init__(self):
        self.kept = [0] * len(self.token_ids)
