"""A request's state inside the engine: its tokens, its KV blocks, its lifecycle.

One `Sequence` per request (no beam search / parallel sampling). The token
list holds the prompt followed by the generated tokens; `num_computed_tokens`
says how many of them already have keys and values in the KV cache. A
sequence needs the forward pass for `token_ids[num_computed_tokens:]`: the
whole prompt (or a chunk of it) at first, one token per decode step after.
Preemption by recompute just drops the blocks and sets the count back to 0.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from engine.core.detokenizer import IncrementalDetokenizer
    from engine.core.outputs import TokenLogprob
    from engine.core.structured_output import GrammarState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 arrival_time: float, *, prompt_text: str | None = None, workload: str = "",
                 trace_context: dict | None = None, stream: bool = True, prompt_text_hash: str = "",
                 rendered_prompt_hash: str = ""):
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        # what the request came as (engine.core.prompt.Prompt): the text the tokenizer encoded and the hashes
        self.prompt_text = prompt_text
        self.prompt_text_hash = prompt_text_hash
        self.rendered_prompt_hash = rendered_prompt_hash
        self.workload = workload
        self.trace_context = trace_context
        self.stream = stream  # streaming callers get an output every step, others only at the end
        self.status = SequenceStatus.WAITING

        # KV cache state (owned by the scheduler / KV cache manager)
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of the first full blocks (memoised)
        self.num_registered_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.num_preemptions = 0

        # lifecycle instants (time.time()); 0.0 until reached
        self.arrival_time = arrival_time
        self.scheduled_time = 0.0
        self.first_token_time = 0.0
        self.finish_time = 0.0
        self.token_times: list[float] = []  # instant of each output token

        # outputs
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.logprobs: list[TokenLogprob] | None = [] if sampling_params.logprobs is not None else None
        # raw logprob of every output token, asked or not (the engine's postprocess appends one per token)
        self.output_logprobs: list[float] = []
        self.prompt_logprobs: list[TokenLogprob | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None)
        # what LLMEngine.make_sequence attaches: the request's own RNG (a seed given), its response_format's
        # grammar state (None: unconstrained), its incremental detokenizer (streamed or stop strings)
        self.generator: torch.Generator | None = None
        self.grammar: GrammarState | None = None
        self.detokenizer: IncrementalDetokenizer | None = None
        self.num_streamed_tokens = 0  # output tokens already handed to a streaming caller
        self.spec_proposed = 0
        self.spec_accepted = 0

    # --- token views -------------------------------------------------------

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling_params.prompt_logprobs is not None

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, status={self.status.value}, tokens={len(self.token_ids)}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")
