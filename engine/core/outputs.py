"""What the engine returns to its callers (offline and streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    # top-n alternatives at this position: token id -> logprob
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class RequestMetrics:
    """Per-request timings, as vLLM reports them (epoch seconds / seconds)."""

    arrival_time: float
    scheduled_time: float = 0.0
    first_token_time: float = 0.0
    finish_time: float = 0.0
    queue_seconds: float = 0.0
    ttft_seconds: float = 0.0
    e2e_seconds: float = 0.0
    mean_itl_seconds: float = 0.0
    cached_tokens: int = 0
    preemptions: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0


@dataclass
class RequestOutput:
    """A request's state: the final result offline, or one increment when streaming.

    When streaming, `new_token_ids` / `new_text` hold what arrived since the
    last output, and `token_ids` / `text` everything so far.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per output token when asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # None for the first prompt token
    metrics: RequestMetrics | None = None


def error_text(e: BaseException) -> str:
    """An exception as a failed request's `error` (and its record's): "ValueError: the message"."""
    return f"{type(e).__name__}: {e}"
