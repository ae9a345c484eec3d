"""OpenAI-compatible request and response shapes (plus vLLM-style extras).

Requests forbid unknown fields, so a typo or an option we do not implement is
a 400 naming the field instead of being silently ignored, and take JSON types
as they are (strict: `"stream": 1` or `"max_tokens": "5"` is a 400, not
coerced; an integer may be written 5.0, as JSON Schema counts it an integer).
Range constraints live here, so the OpenAPI schema states them and validation
errors name them.

The schema says exactly what the server accepts. Limits that admission checks
with its own messages (only n=1, logit_bias keys in the vocabulary, at most 16
non-empty stop strings, top_logprobs only with logprobs ...) are stated as JSON Schema keywords only
(`admitted(...)`, `json_schema_extra`): in the schema, not checked by pydantic.
What depends on the served model (its name, its vocabulary, its context) is
filled in per server by engine/serving/server/openapi.py at the fields marked
`x-infersight`. One limit no JSON Schema can state is the context in tokens
(prompt tokens + max_tokens <= max_model_len): a request past it is a 400 with
code `context_length_exceeded`.

Extras beyond OpenAI (as vLLM offers them): `top_k`, `stop_token_ids`,
`ignore_eos`, `return_token_ids` (prompt and output token IDs in the
response), `return_metrics` (per-request timings: queue, TTFT, e2e, mean ITL).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from engine.core.sampling_params import INT64_MAX, MAX_LOGPROBS
MAX_STOP_STRINGS = 16
# OpenAI's rule for a function's name (tools, tool_choice) and a json_schema format's name
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_CHOICES = 64  # n and best_of, and prompts in one completions request (at most 64 x 64 samples: the scheduler queues them)


def _integral(value):
    """5.0 -> 5: JSON Schema's integers include integral floats; strict validation then refuses the rest."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(*metadata):
    """An integer: its constraints first, then 5.0 -> 5 (constraints after a validator would vanish from the
    schema)."""
    return Annotated[int, *metadata, BeforeValidator(_integral)]


def admitted(**keywords):
    """JSON Schema keywords for a limit admission enforces (with its own message): schema only."""
    return Field(json_schema_extra=keywords)


def _served(kind: str):
    """Marks a schema node that engine/serving/server/openapi.py fills in from the served model."""
    return admitted(**{"x-infersight": kind})


NonNegFloat = Annotated[float, Field(ge=0.0)]
TokenId = Annotated[_int(Field(ge=0)), _served("token_id")]  # maximum: the vocabulary's last ID
PromptText = Annotated[str, _served("prompt_text")]  # maxLength: what can fit the context
CountableText = Annotated[str, _served("countable_text")]  # maxLength: what /tokenize counts (text_check.py)
StopString = Annotated[str, admitted(minLength=1)]
NewTokens = Annotated[_int(), admitted(minimum=1), _served("new_tokens")]  # maximum: max_model_len - 1
# a completion's: 0 too, with echo (the prompt alone, as vLLM answers it: _echo_without_generation)
EchoNewTokens = Annotated[_int(), admitted(minimum=0), _served("new_tokens")]
# up to 2**53 - 1, the integers every JSON parser keeps exactly (I-JSON, RFC 7493): a larger seed written
# as a float would round to another number
Seed = _int(Field(ge=0, le=2**53 - 1))
TopLogprobs = _int(Field(ge=0, le=MAX_LOGPROBS))
Count = _int(Field(ge=1))
LogitBias = Annotated[float, Field(ge=-100.0, le=100.0)]


def _stream_options_need_stream() -> dict:
    return {"if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
            "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]}}


def _echo_without_generation() -> dict:
    return {"if": {"properties": {"max_tokens": {"const": 0}}, "required": ["max_tokens"]},
            "then": {"properties": {"echo": {"const": True}}, "required": ["echo"]}}


def _tools_need_a_template_that_renders_them() -> dict:
    """Filled in by openapi.py (tool_calls.openapi_keywords): where the chat template does not render tools,
    tools only with tool_choice 'none' (answered as without them, as vLLM does)."""
    return {"x-infersight": "tools_without_template"}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    """Fields both endpoints share."""

    model: Annotated[str, _served("model")] = Field(min_length=1,
                                                    description="the served model name (see /v1/models)")
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # at most the sampler's int64 (SamplingParams checks it, naming the field); past the vocabulary it is off
    top_k: _int(Field(ge=-1)) = Field(-1, description="-1: off, else >= 1",
                                      json_schema_extra={"not": {"const": 0}, "maximum": INT64_MAX})
    seed: Seed | None = None
    stop: (StopString | Annotated[list[StopString], admitted(maxItems=MAX_STOP_STRINGS)] | None) = Field(
        None, description=f"stop strings (up to {MAX_STOP_STRINGS}, none empty)")
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    n: Annotated[Count, admitted(maximum=MAX_CHOICES)] = Field(1, description="choices per prompt")
    skip_special_tokens: bool = Field(True, description="false: special tokens stay in the text")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this where a token is in the output")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this times the token's output count")
    repetition_penalty: float = Field(1.0, gt=0.0, description="vLLM's: seen (prompt or output) tokens' logits "
                                                               "/ this where > 0, * this where < 0; 1: off")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="vLLM's: drop tokens below min_p * the top probability")
    logit_bias: Annotated[dict[str, LogitBias], _served("token_id_keys")] | None = Field(
        None, description="token ID (a decimal string) -> bias in [-100, 100], added to its logit")
    user: str | None = None
    return_token_ids: bool = Field(False, description="add prompt_token_ids and choices[].token_ids")
    return_metrics: bool = Field(False, description="add a `metrics` object with per-request timings")


class CompletionRequest(_SamplingFields):
    model_config = ConfigDict(json_schema_extra={"allOf": [_stream_options_need_stream(), _echo_without_generation()]})

    # a list of prompts (texts or token-ID lists): one choice per prompt and sample (index i * n + j)
    prompt: (PromptText | Annotated[list[TokenId], admitted(minItems=1)]
             | Annotated[list[PromptText], admitted(minItems=1, maxItems=MAX_CHOICES)]
             | Annotated[list[Annotated[list[TokenId], admitted(minItems=1)]],
                         admitted(minItems=1, maxItems=MAX_CHOICES)]
             ) = Field(description="a string, a non-empty list of token IDs, or a list of either")
    max_tokens: EchoNewTokens | None = Field(16, description="tokens to generate; null: up to the context length; "
                                                              "0 only with echo: the prompt alone")
    logprobs: TopLogprobs | None = Field(None, description="top-n logprobs per token")
    prompt_logprobs: TopLogprobs | None = Field(
        None, description="vLLM's extension: the logprob of each prompt token (teacher forcing) and its top-n")
    echo: bool = Field(False, description="the prompt prepended to each choice's text (and logprobs)")
    best_of: Annotated[Count, admitted(maximum=MAX_CHOICES)] | None = Field(
        None, description="samples per prompt (>= n), the n of highest cumulative logprob returned; not streamed")
    suffix: Annotated[str, admitted(maxLength=0)] | None = Field(None, description="not supported")
    response_format: ResponseFormat | None = Field(None, description="vLLM's: as chat completions take it")


class TextPart(_Request):
    type: Literal["text"]
    text: PromptText


class FunctionCall(_Request):
    name: str
    arguments: PromptText = Field(description="the arguments as JSON text")


class MessageToolCall(_Request):
    """A tool call of an earlier assistant message (as a response's message.tool_calls gave it)."""
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: PromptText | list[TextPart] | None = Field(None, description="null: empty (an assistant's "
                                                                           "message that only calls tools)")
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(None, description="an assistant message's tool calls")
    tool_call_id: str | None = Field(None, description="a tool message: the call it answers")


class CountableTextPart(TextPart):
    text: CountableText


class CountableFunctionCall(FunctionCall):
    arguments: CountableText = Field(description="the arguments as JSON text")


class CountableToolCall(MessageToolCall):
    function: CountableFunctionCall


class CountableMessage(ChatMessage):
    """A message /tokenize counts: its text may be longer than the context (that is what is measured)."""
    content: CountableText | list[CountableTextPart] | None = None
    tool_calls: list[CountableToolCall] | None = None


class TextFormat(_Request):
    type: Literal["text"]


class JSONObjectFormat(_Request):
    type: Literal["json_object"] = Field(description="the output is one JSON object (constrained decoding)")


class JSONSchemaSpec(_Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    # `schema` would shadow BaseModel.schema: kept under another attribute, read and written by its alias
    schema_: dict = Field(alias="schema", description="a JSON Schema the output must validate against "
                          "(xgrammar strict mode: no properties or items beyond those listed)")
    strict: bool | None = Field(None, description="accepted; the output always follows the schema strictly")


class JSONSchemaFormat(_Request):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


# engine/core/structured_output.py turns the two JSON formats into grammars
ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaFormat, Field(discriminator="type")]


class ChatCompletionRequest(_SamplingFields):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        _stream_options_need_stream(),
        {"if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
         "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}},
        {"not": {"properties": {"max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"}},
                 "required": ["max_tokens", "max_completion_tokens"]}},
        _tools_need_a_template_that_renders_them(),
    ]})

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: NewTokens | None = Field(None, description="deprecated name of max_completion_tokens (not both)")
    max_completion_tokens: NewTokens | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = Field(None, description="only with logprobs: true")
    # accepted where the chat template renders tools (engine/serving/server/tool_calls.py), elsewhere only with
    # tool_choice 'none': openapi.py fills in the served model's schema (tool_calls.openapi_keywords)
    tools: Annotated[list[dict], _served("tools")] | None = Field(
        None, description="[{type: function, function: {name, description, parameters}}]: where the model's "
                          "chat template renders tools; elsewhere only with tool_choice 'none'")
    tool_choice: str | dict | None = Field(
        None, description="'none', 'auto' (default with tools), 'required' or {type: function, function: "
                          "{name}}; without tools: null or 'none'", json_schema_extra={"x-infersight": "tool_choice"})
    response_format: ResponseFormat | None = Field(
        None, description="text (default), json_object, or json_schema: constrained decoding")
    add_generation_prompt: bool = True


class TokenizeRequest(_Request):
    """vLLM's /tokenize: a prompt (as /v1/completions takes it) or messages (as /v1/chat/completions)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
        {"properties": {"messages": {"type": "array"}}, "required": ["messages"]}]})

    model: Annotated[str, _served("model")] = Field(min_length=1)
    prompt: CountableText | None = Field(None, description="give prompt or messages, not both")
    messages: list[CountableMessage] | None = Field(None, min_length=1)
    add_generation_prompt: bool = True


class DetokenizeRequest(_Request):
    """vLLM's /detokenize: the text of token IDs."""

    model: Annotated[str, _served("model")] = Field(min_length=1)
    tokens: list[TokenId] = Field(max_length=1 << 20)


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


class PromptLogprob(BaseModel):
    logprob: float
    rank: int | None = None  # None: not among the top-n asked (the engine keeps no full ranking)
    decoded_token: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    # vLLM's: the stop string or stop token ID that ended the choice; null for EOS or length
    stop_reason: str | int | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None
    # vLLM's format: None for the first prompt token, then {token id: {logprob, rank, decoded_token}}
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None  # the replica's identity: a hash of its weights and config
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


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the message only calls tools
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None  # the replica's identity: a hash of its weights and config
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


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class ServerLoad(BaseModel):
    server_load: int  # vLLM's /load: generation requests held now


class Health(BaseModel):
    status: Literal["ok", "draining", "error"]
    replica_id: str
    model: str
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    in_flight: int = 0
    max_in_flight: int | None = None  # max_num_seqs + max_queue: beyond it requests get 429
    # what decode steps run (ModelRunner.compile_state): "off", "building" (eager until the compiled steps are
    # built, in the background), "ready" or "failed" (eager)
    compiled_decode: Literal["off", "building", "ready", "failed"] | None = None
