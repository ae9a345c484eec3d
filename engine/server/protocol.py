"""OpenAI-compatible request and response shapes (plus vLLM-style extras).

Requests forbid unknown fields, so a typo or an option we do not implement is
a 400 naming the field instead of being silently ignored. Range constraints
live here, so the OpenAPI schema states them and validation errors name them.

Extras beyond OpenAI (as vLLM offers them): `top_k`, `stop_token_ids`,
`ignore_eos`, `return_token_ids` (prompt and output token IDs in the
response), `return_metrics` (per-request timings: queue, TTFT, e2e, mean ITL).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20

NonNegFloat = Annotated[float, Field(ge=0.0)]
TokenId = Annotated[int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    """Fields both endpoints share."""

    model: str = Field(description="the served model name (see /v1/models)")
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1: off")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(None, description="stop strings (up to 16)")
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    n: int = Field(1, ge=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="only 0 is supported")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="only 0 is supported")
    logit_bias: dict[str, float] | None = Field(None, description="not supported")
    user: str | None = None
    return_token_ids: bool = Field(False, description="add prompt_token_ids and choices[].token_ids")
    return_metrics: bool = Field(False, description="add a `metrics` object with per-request timings")


class CompletionRequest(_SamplingFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="a string or a list of token IDs (one prompt per request)")
    max_tokens: int | None = Field(16, description="tokens to generate; null: up to the context length")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="top-n logprobs per token")
    echo: bool = Field(False, description="not supported")
    best_of: int | None = Field(None, ge=1, description="only 1 is supported")
    suffix: str | None = Field(None, description="not supported")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, description="deprecated name of max_completion_tokens")
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict] | None = Field(None, description="not supported")
    tool_choice: str | dict | None = Field(None, description="not supported")
    response_format: ResponseFormat | None = Field(None, description="only type=text is supported")
    add_generation_prompt: bool = True


class TokenizeRequest(_Request):
    """vLLM's /tokenize: a prompt (as /v1/completions takes it) or messages (as /v1/chat/completions)."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


# ---------------------------------------------------------------- responses


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class RequestTimings(BaseModel):
    """Per-request timings as the engine measured them (epoch seconds / seconds)."""

    arrival_time: float
    scheduled_time: float
    first_token_time: float
    finish_time: float
    queue_seconds: float
    ttft_seconds: float
    e2e_seconds: float
    mean_itl_seconds: float
    cached_tokens: int = 0
    preemptions: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    metrics: RequestTimings | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    metrics: RequestTimings | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "infersight"
    max_model_len: int | None = None
    root: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class Health(BaseModel):
    status: Literal["ok", "draining", "error"]
    replica_id: str
    model: str
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    in_flight: int = 0
