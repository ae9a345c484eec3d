"""A proxied request -> its `requests` rows (one per choice), as infersight's own engine writes them.

- ids: the request id is the one sent upstream as `X-Request-Id` (the client's, or the proxy's
  when it sent none); a response with several choices gives `<id>-<index>` per choice;
- what it came as: `prompt_text_hash` is a completion's `text_sha256(prompt)` or a chat's
  `chat_messages_hash(messages)`, `rendered_prompt_hash` the hash of the prompt the upstream's chat
  template rendered (when it returned it), so rows compare with every other replica's;
- `sampling_params_json` is the engine's own layout (`engine.core.sampling_params.SamplingParams`, the
  OpenAI defaults filled in as infersight's server fills them), so the same request has the same
  parameters on a proxied replica and on an infersight one (the drift diagnostic pairs on them);
- timings are the proxy's: arrival when the request reached it, each output token when its chunk
  passed. What it cannot see is UNKNOWN (nan), never 0, and stays out of every percentile: the
  upstream's queue and prefill (scheduled time 0), and a non-streamed response's first token (first
  token time 0, token times [], TTFT unknown). The engine behind it (vLLM's plugin) writes what it
  measured of the same request to `engine_request_timings` (telemetry.contract.derived.engine_timed_sql);
- output_logprobs are the upstream's logprobs of the sampled tokens (asked by the proxy where the
  client did not, on the `--logprobs-fraction` share of requests), kept only when there is exactly
  one per output token ([] otherwise, and on a request not asked: not measured, never a value);
- prompt_logprobs (a client that asked for them: the cross-scorer's rescore requests) are the prompt
  tokens' own logprobs after the first, one per position or [] (capture.prompt_token_logprobs), as
  infersight's engine records them, so a vLLM replica behind the proxy can score its peers' requests;
- token IDs come from the upstream; where it gave none, the proxy's `--model-dir` tokenizer makes
  them (marked `"token_ids_source": "proxy_tokenizer"` in sampling_params_json; `"none"` without a
  tokenizer), so such rows never pass for the upstream's own IDs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.core.generation_defaults import GenerationDefaults
from engine.core.prompt import chat_prompt, text_prompt
from engine.serving.proxy.capture import ChoiceCapture, ResponseCapture, prompt_token_logprobs
from engine.serving.server.tool_calls import recorded_tool_fields
from telemetry.contract.derived import UNKNOWN, e2e_seconds
from telemetry.contract.records import RequestRecord, chat_messages_hash, text_sha256


@dataclass(frozen=True)
class ProxiedRequest:
    replica_id: str
    request_id: str
    trace_id: str
    workload: str
    kind: str  # "completion" | "chat"
    body: dict  # as the client sent it


def _prompts(body: dict) -> list:
    """A completion's prompts: text or token IDs, one per entry of a batch."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return list(prompt)
    return [prompt]


def _messages(body: dict) -> list[dict]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict)]


def sampling_params_json(body: dict, kind: str, prompt_len: int, max_model_len: int | None,
                         token_ids_source: str | None = None, defaults: GenerationDefaults | None = None) -> str:
    """The request's sampling parameters in the engine's layout (SamplingParams.to_json), as the upstream
    served them: a field the client left unset takes the model's generation default (`defaults`: what the
    upstream applies, vLLM's `--generation-config`), else the API's own."""
    defaults = defaults or GenerationDefaults()
    body = {**body, **defaults.unset({k for k, v in body.items() if v is not None})}
    if kind == "chat":
        max_tokens = body.get("max_tokens") if body.get("max_tokens") is not None else body.get("max_completion_tokens")
        logprobs = (body.get("top_logprobs") or 0) if body.get("logprobs") else None
    else:
        max_tokens = body.get("max_tokens", 16)
        logprobs = body.get("logprobs")
    # as the servers fill it: the model's default, else the rest of the context (admission's own rule)
    max_tokens = defaults.max_tokens(max_tokens, max(1, max_model_len - prompt_len) if max_model_len else None)
    stop = body.get("stop")
    params = {"temperature": _number(body.get("temperature"), 1.0, float), "top_k": _number(body.get("top_k"), -1, int),
              "top_p": _number(body.get("top_p"), 1.0, float), "max_tokens": _number(max_tokens, None, int),
              "seed": _number(body.get("seed"), None, int),
              "stop_token_ids": list(body.get("stop_token_ids") or []),
              "stop": [stop] if isinstance(stop, str) else list(stop or []),
              "ignore_eos": bool(body.get("ignore_eos", False)), "logprobs": _number(logprobs, None, int),
              "prompt_logprobs": _number(body.get("prompt_logprobs"), None, int),
              "presence_penalty": _number(body.get("presence_penalty"), 0.0, float),
              "frequency_penalty": _number(body.get("frequency_penalty"), 0.0, float),
              "repetition_penalty": _number(body.get("repetition_penalty"), 1.0, float),
              "min_p": _number(body.get("min_p"), 0.0, float), "logit_bias": _logit_bias(body.get("logit_bias")),
              # the API request a sample belongs to, as infersight's server records it (engine/serving/server/admission.py)
              "n": _number(body.get("n"), 1, int),
              "best_of": _number(body.get("best_of"), None, int) if kind == "completion" else None,
              "response_format": _response_format(body.get("response_format"))}
    if kind == "chat":  # tools_hash / tool_choice (and a forced call's format), as the server records them
        params.update(recorded_tool_fields(body.get("tools"), body.get("tool_choice")))
    if token_ids_source is not None:
        params["token_ids_source"] = token_ids_source
    return json.dumps(params, sort_keys=True)


def _response_format(value) -> dict | None:
    """A constrained format as the engine records it; plain text (or none) is None."""
    return value if isinstance(value, dict) and value.get("type") not in (None, "text") else None


def _logit_bias(value) -> dict[str, float] | None:
    """As SamplingParams.to_json writes it: string token IDs -> float biases; empty or unreadable -> None."""
    if not isinstance(value, dict) or not value:
        return None
    return {str(k): _number(v, 0.0, float) for k, v in value.items()}


def _number(value, default, kind):
    """As the server's schema reads it (0 -> 0.0 for a float field); unset or unreadable -> `default`."""
    if value is None or isinstance(value, bool):
        return default
    try:
        return kind(value)
    except (TypeError, ValueError):
        return default


def _input(req: ProxiedRequest, index: int, n_choices: int) -> tuple[str | list[int] | None, str]:
    """(the choice's prompt text or token IDs, its prompt_text_hash)."""
    if req.kind == "chat":
        return None, chat_messages_hash(_messages(req.body), req.body.get("add_generation_prompt", True))
    prompts = _prompts(req.body)
    per_prompt = max(1, n_choices // max(1, len(prompts)))
    prompt = prompts[min(index // per_prompt, len(prompts) - 1)]
    return prompt, (text_sha256(prompt) if isinstance(prompt, str) else "")


def _prompt_ids(req: ProxiedRequest, prompt, tokenizer) -> list[int]:
    """The prompt's token IDs as the engine would make them (the fallback: the proxy's tokenizer)."""
    if req.kind == "chat":
        plain = [{"role": str(m.get("role", "")), "content": _content(m.get("content"))} for m in _messages(req.body)]
        return chat_prompt(tokenizer, plain, req.body.get("add_generation_prompt", True)).token_ids
    if isinstance(prompt, str):
        return text_prompt(tokenizer, prompt).token_ids
    return list(prompt or [])


def _content(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def prompt_length(req: ProxiedRequest, tokenizer) -> int:
    """The request's prompt length in tokens as the proxy's tokenizer makes them (a batch of prompts: its
    longest)."""
    if req.kind == "chat":
        return len(_prompt_ids(req, None, tokenizer))
    return max(len(_prompt_ids(req, prompt, tokenizer)) for prompt in _prompts(req.body))


def needs_tokenizer(capture: ResponseCapture) -> bool:
    return any(_ids_missing(capture, c) for c in capture.choices.values())


def _ids_missing(capture: ResponseCapture, c: ChoiceCapture) -> bool:
    return (c.prompt_token_ids is None and capture.prompt_token_ids is None) or not c.upstream_output_ids


def build_records(req: ProxiedRequest, capture: ResponseCapture, *, max_model_len: int | None = None,
                  tokenizer=None, defaults: GenerationDefaults | None = None) -> list[RequestRecord]:
    """One row per choice the response carried (none for a response without choices)."""
    records = []
    n = len(capture.choices)
    for index in sorted(capture.choices):
        c = capture.choices[index]
        prompt, text_hash = _input(req, index, n)
        prompt_ids = c.prompt_token_ids if c.prompt_token_ids is not None else capture.prompt_token_ids
        output_ids, output_text = list(c.output_token_ids), "".join(c.text)
        source = None  # the upstream's own IDs: the engine's layout, unmarked
        if _ids_missing(capture, c):
            source = "none"
            if tokenizer is not None:
                source = "proxy_tokenizer"
                if prompt_ids is None:
                    prompt_ids = _prompt_ids(req, prompt, tokenizer)
                if not c.upstream_output_ids:
                    output_ids = tokenizer.encode(output_text, add_special_tokens=False)
        prompt_ids = list(prompt_ids or (prompt if isinstance(prompt, list) else []))
        usage = capture.usage or {}
        prompt_tokens = len(prompt_ids) or int(usage.get("prompt_tokens") or 0)
        output_tokens = len(output_ids) or (c.counted_tokens if capture.streamed
                                            else int(usage.get("completion_tokens") or 0) if n == 1 else 0)
        arrival, finish = capture.arrival_time, capture.finish_time
        first = c.token_times[0] if c.token_times else 0.0  # this choice's own first token, where seen
        ttft = first - arrival if first else UNKNOWN
        finish_reason = c.finish_reason or ("error" if capture.error else "abort")
        if capture.error and not c.finish_reason:
            finish_reason = "error"
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) if n == 1 else 0
        rendered = capture.prompt_text if req.kind == "chat" else None
        records.append(RequestRecord(
            replica_id=req.replica_id, request_id=req.request_id if n == 1 else f"{req.request_id}-{index}",
            trace_id=req.trace_id, model_name=str(req.body.get("model", "")), workload=req.workload,
            arrival_time=arrival, scheduled_time=0.0, first_token_time=first, finish_time=finish,
            queue_seconds=UNKNOWN, prefill_seconds=UNKNOWN, ttft_seconds=ttft, e2e_seconds=e2e_seconds(arrival, finish),
            prompt_tokens=prompt_tokens, output_tokens=output_tokens, cached_tokens=int(cached),
            prompt_token_ids=prompt_ids, output_token_ids=output_ids,
            token_times=[t - arrival for t in c.token_times] if len(c.token_times) == output_tokens else [],
            sampling_params_json=sampling_params_json(req.body, req.kind, prompt_tokens, max_model_len, source,
                                                       defaults),
            finish_reason=finish_reason, error=capture.error if finish_reason == "error" else "",
            prompt_text_hash=text_hash, prompt_text=(prompt if isinstance(prompt, str) else rendered or ""),
            output_text=output_text, rendered_prompt_hash=text_sha256(rendered) if rendered else "",
            output_logprobs=list(c.output_logprobs) if len(c.output_logprobs) == len(output_ids) else [],
            prompt_logprobs=prompt_token_logprobs(c.prompt_logprobs, prompt_ids)))
    return records
