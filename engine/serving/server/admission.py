"""Turn an API request into what the engine takes (a Prompt and SamplingParams), or a 400.

Everything a client can get wrong is checked here, before the engine sees
the request, so the message names the parameter and the limit: invalid Unicode
and text too long to ever fit (both before tokenizing: text_check.py),
unsupported options, token IDs outside the vocabulary, a prompt longer than the
context, max_tokens that does not fit beside the prompt.

Admission tokenizes (and renders chat templates), which can take a while for a
long prompt: the server runs it on a worker thread, never on the event loop.

The border with the engine is crossed once: a text prompt is tokenized here,
once, through the engine's tokenization cache (a chat's messages rendered by
the chat template first), and the engine is handed an `engine.core.prompt.Prompt`
holding those token IDs and what the request came as (the text, the hash of a
completion's text or of a chat's messages, a chat's rendered text and its hash).
The engine neither encodes it again nor checks its vocabulary again.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from engine.core.generation_defaults import GenerationDefaults
from engine.core.prompt import Prompt, chat_prompt, ids_prompt, invalid_token_ids, text_prompt
from engine.core.sampling_params import SamplingParams
from engine.serving.server.errors import APIError
from engine.serving.server.model_info import ServedModel
from engine.serving.server.protocol import MAX_CHOICES, MAX_STOP_STRINGS, ChatCompletionRequest, CompletionRequest
from engine.serving.server.text_check import check_countable, check_fits, check_unicode
from engine.serving.server.tool_calls import ToolPlan, constrain, plan_tools, template_message

_DECIMAL = re.compile(r"0|[1-9][0-9]*")  # a logit_bias key: a token ID as JSON writes it


@dataclass
class Admitted:
    engine_prompt: Prompt  # what the engine is given: the token IDs made here, and what the request came as
    sampling_params: SamplingParams
    # a completion's list of prompts, after the first: each with its params (max_tokens fits each prompt)
    more_prompts: list[tuple[Prompt, SamplingParams]] = field(default_factory=list)
    n: int = 1  # choices per prompt
    best_of: int = 1  # samples per prompt, of which the n of highest cumulative logprob are kept
    echo: bool = False  # completions: the prompt prepended to each choice
    echo_only: bool = False  # echo with max_tokens 0 (`echo_only` below)
    skip_special_tokens: bool = True
    tools: ToolPlan | None = None  # chat with tools: how the output becomes tool calls (tool_calls.py)

    @property
    def is_group(self) -> bool:
        """More than one engine request (engine/serving/server/choices.py)."""
        return bool(self.more_prompts) or self.best_of > 1

    def engine_requests(self) -> list[tuple[Prompt, SamplingParams]]:
        """(prompt, params) of each sample: prompt i's sample j is entry i * best_of + j, seeded seed + j
        (vLLM's child seeds)."""
        return [(p, dataclasses.replace(sp, seed=None if sp.seed is None else sp.seed + j))
                for p, sp in [(self.engine_prompt, self.sampling_params), *self.more_prompts]
                for j in range(self.best_of)]

    @property
    def prompt(self) -> str | list[int]:
        """The client's prompt text, or the token IDs (a chat's: as its template rendered them)."""
        p = self.engine_prompt
        return p.text if p.kind == "text" else p.token_ids

    @property
    def prompt_len(self) -> int:  # in tokens
        return len(self.engine_prompt.token_ids)


def _unsupported(param: str, why: str) -> APIError:
    return APIError(f"{param}: {why}", param=param, code="unsupported_parameter")


def _check_model(model: str, served: ServedModel) -> None:
    if model != served.name:  # 404, as OpenAI and vLLM answer it
        raise APIError(f"model {model!r} does not exist; this server serves {served.name!r} (see /v1/models)",
                       status=404, param="model", code="model_not_found")


def _check_common(req: CompletionRequest | ChatCompletionRequest, served: ServedModel) -> None:
    check_unicode(req)
    _check_model(req.model, served)
    _check_logit_bias(req.logit_bias, served)
    if req.stream_options is not None and not req.stream:
        raise APIError("stream_options is only allowed when stream is true", param="stream_options")
    bad = [t for t in req.stop_token_ids if t >= served.vocab_size]
    if bad:
        raise APIError(f"stop_token_ids {bad[:5]} are outside the vocabulary (size {served.vocab_size})",
                       param="stop_token_ids", code="invalid_token_id")


def _check_logit_bias(bias: dict[str, float] | None, served: ServedModel) -> None:
    """Keys are token IDs written in decimal (no sign, spaces or leading zeros), inside the vocabulary."""
    longest = len(str(served.vocab_size))  # before int(): a 5000-digit key is refused, not parsed
    bad = [k for k in bias or {} if len(k) > longest or not _DECIMAL.fullmatch(k) or int(k) >= served.vocab_size]
    if bad:
        raise APIError(f"logit_bias: keys {bad[:5]} are not token IDs of this vocabulary (decimal strings "
                       f"0..{served.vocab_size - 1})", param="logit_bias", code="invalid_token_id")


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise APIError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", param="stop")
    if any(s == "" for s in stops):
        raise APIError("stop: stop strings must not be empty", param="stop")
    return stops


def _check_token_ids(ids: list[int], served: ServedModel, param: str) -> None:
    if not ids:
        raise APIError(f"{param} must not be empty", param=param)
    bad = invalid_token_ids(ids, served.vocab_size)
    if bad:
        raise APIError(f"{param}: token IDs {bad[:5]} are outside the vocabulary (valid: 0..{served.vocab_size - 1})",
                       param=param, code="invalid_token_id")


def _max_tokens(requested: int | None, prompt_len: int, served: ServedModel, param: str) -> int:
    context = served.max_model_len
    if prompt_len >= context:
        raise APIError(f"the prompt is {prompt_len} tokens but this model's maximum context length is "
                       f"{context} tokens (prompt plus at least one generated token)",
                       param="messages" if param == "max_completion_tokens" else "prompt",
                       code="context_length_exceeded", detail={"prompt_tokens": prompt_len, "max_model_len": context})
    room = context - prompt_len
    if requested is None:  # the model's max_new_tokens where it has one (vLLM's), else the context
        return served.generation_defaults.max_tokens(None, room)
    if requested < 1:
        raise APIError(f"{param} must be at least 1, got {requested}", param=param)
    if requested > room:
        raise APIError(f"this model's maximum context length is {context} tokens; the request asks for "
                       f"{prompt_len} prompt + {requested} completion tokens; lower {param} to at most {room}",
                       param=param, code="context_length_exceeded",
                       detail={"prompt_tokens": prompt_len, "max_model_len": context, param: requested})
    return served.generation_defaults.max_tokens(requested, room)  # a directory's max_new_tokens caps it


def _sampling_params(req, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None,
                     defaults: GenerationDefaults | None = None) -> SamplingParams:
    # the fields the client left unset take the model's defaults (engine/core/generation_defaults.py: vLLM's
    # generation_config), the others its own values; the record holds the values used
    model = defaults.unset(req.model_fields_set) if defaults is not None else {}

    def value(name: str):
        return model.get(name, getattr(req, name))

    try:
        return SamplingParams(
            temperature=value("temperature"), top_k=value("top_k"), top_p=value("top_p"), max_tokens=max_tokens,
            seed=req.seed, stop_token_ids=list(req.stop_token_ids), stop=_stop_strings(req.stop),
            ignore_eos=req.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            presence_penalty=value("presence_penalty"), frequency_penalty=value("frequency_penalty"),
            repetition_penalty=value("repetition_penalty"), min_p=value("min_p"),
            logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
            response_format=_response_format(req.response_format),  # validated (xgrammar parses it) there
        )
    except ValueError as e:  # SamplingParams.validate's message names the parameter
        raise APIError(str(e), param=str(e).split(" ")[0].rstrip(":")) from None


def _response_format(fmt) -> dict | None:
    """json_object / json_schema as the client sent it (so the proxy's record matches: engine/serving/proxy/request_row.py);
    text: None."""
    return None if fmt is None or fmt.type == "text" else fmt.model_dump(by_alias=True, exclude_unset=True)


def _is_prompt_list(prompt) -> bool:
    """A list of prompts (texts or token-ID lists), not one prompt of token IDs."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))


def admit_completion(req: CompletionRequest, served: ServedModel) -> Admitted:
    _check_common(req, served)
    best_of = req.n if req.best_of is None else req.best_of
    for param, value in (("n", req.n), ("best_of", best_of),
                         ("prompt", len(req.prompt) if _is_prompt_list(req.prompt) else 1)):
        if value > MAX_CHOICES:
            raise APIError(f"{param}: at most {MAX_CHOICES}, got {value}", param=param)
    # two rules that relate two fields, which no JSON Schema can state (codes of their own, see the
    # schemathesis test): OpenAI's and vLLM's
    if best_of < req.n:
        raise APIError(f"best_of must be at least n ({req.n}), got {best_of}", param="best_of",
                       code="best_of_less_than_n")
    if best_of > req.n and req.stream:  # the best are known only at the end
        raise APIError("best_of > n cannot be streamed", param="best_of", code="best_of_streamed")
    if req.suffix:
        raise _unsupported("suffix", "suffix is not supported")
    # the engine's logprobs: best_of ranks by cumulative logprob; echo's come from the prompt's
    logprobs = 0 if req.logprobs is None and best_of > req.n else req.logprobs
    prompt_logprobs = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_logprobs = max(req.logprobs, prompt_logprobs or 0)

    prompts = req.prompt
    if not _is_prompt_list(prompts):
        prompts = [prompts]  # one prompt: a text or a list of token IDs
    admitted = []
    for prompt in prompts:
        if isinstance(prompt, str):
            check_fits(len(prompt), "prompt", served.max_model_len, served.chars_per_token)
            engine_prompt = text_prompt(served.tokenizer, prompt)  # the one tokenization of this text
        else:
            _check_token_ids(prompt, served, "prompt")
            engine_prompt = ids_prompt(prompt)
        max_tokens = _max_tokens(1 if echo_only(req) else req.max_tokens, len(engine_prompt), served, "max_tokens")
        params = _sampling_params(req, max_tokens, logprobs, prompt_logprobs, served.generation_defaults)
        params.n, params.best_of = req.n, req.best_of
        admitted.append((engine_prompt, params))
    (first, params), more = admitted[0], admitted[1:]
    return Admitted(first, params, more_prompts=more, n=req.n, best_of=best_of, echo=req.echo,
                    echo_only=echo_only(req), skip_special_tokens=req.skip_special_tokens)


def echo_only(req: CompletionRequest) -> bool:
    """echo with max_tokens 0: the prompt alone (with its logprobs), as vLLM answers it; the engine runs one
    step (the prompt's logprobs come from its prefill) whose token is not shown."""
    return req.echo and req.max_tokens == 0


def tokenize(req, served: ServedModel) -> list[int]:
    """What /tokenize answers: the token IDs the engine would be given for this prompt or conversation
    (made the way admission makes them)."""
    check_unicode(req)
    _check_model(req.model, served)
    if (req.prompt is None) == (req.messages is None):
        raise APIError("give either prompt or messages", param="prompt")
    if req.prompt is not None:
        check_countable(len(req.prompt), "prompt", served.max_model_len, served.chars_per_token)
        return text_prompt(served.tokenizer, req.prompt).token_ids
    return _render_chat(req.messages, req.add_generation_prompt, served, check_countable).token_ids


def detokenize(req, served: ServedModel) -> str:
    """What /detokenize answers: the text of the token IDs, special tokens kept (`<|bos|>` ...), as vLLM's does:
    the inverse of /tokenize, whose IDs hold them."""
    _check_model(req.model, served)
    bad = [t for t in req.tokens if not 0 <= t < served.vocab_size]
    if bad:
        raise APIError(f"token id {bad[0]} is out of the vocabulary [0, {served.vocab_size})", param="tokens")
    return served.tokenizer.decode(list(req.tokens), skip_special_tokens=False)


def _message_text(content) -> str:
    if content is None:  # an assistant message that only calls tools
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _render_chat(messages, add_generation_prompt: bool, served: ServedModel, check_length=check_fits,
                 tools: list[dict] | None = None) -> Prompt:
    plain = [template_message(m, _message_text(m.content)) for m in messages]
    chars = sum(len(m["content"]) for m in plain) + sum(len(c.function.arguments) for m in messages
                                                        for c in m.tool_calls or [])
    check_length(chars, "messages", served.max_model_len, served.chars_per_token)
    extra = {"tools": tools} if tools else {}
    try:
        return chat_prompt(served.tokenizer, plain, add_generation_prompt=add_generation_prompt, **extra)
    except Exception as e:  # a template may reject a conversation (e.g. roles out of order)
        raise APIError(f"messages: the chat template rejected the conversation: {e}", param="messages") from None


def admit_chat(req: ChatCompletionRequest, served: ServedModel) -> Admitted:
    _check_common(req, served)
    tools = plan_tools(req, served)  # None without tools; 400s for tools this server cannot serve
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        raise APIError("give max_completion_tokens or max_tokens, not both", param="max_tokens")

    engine_prompt = _render_chat(req.messages, req.add_generation_prompt, served,
                                 tools=tools.tools if tools is not None else None)
    param = "max_tokens" if req.max_tokens is not None else "max_completion_tokens"
    max_tokens = _max_tokens(req.max_completion_tokens if req.max_tokens is None else req.max_tokens,
                             len(engine_prompt), served, param)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    if req.n > MAX_CHOICES:
        raise APIError(f"n: at most {MAX_CHOICES} choices, got {req.n}", param="n")
    params = _sampling_params(req, max_tokens, logprobs, defaults=served.generation_defaults)
    params.n = req.n
    if tools is not None:
        constrain(params, tools)
    skip_special = req.skip_special_tokens and not (tools is not None and tools.keeps_special_tokens)
    return Admitted(engine_prompt, params, n=req.n, best_of=req.n, skip_special_tokens=skip_special, tools=tools)
