"""Send one request and time it from the client's side.

Client-side times (time.perf_counter, from just before the request is sent):
- TTFT: until the first SSE chunk that carries an output token;
- ITL: the gaps between chunks that carry tokens, split evenly over the tokens
  a chunk carries (a speculative step can deliver several at once);
- e2e: until the response is complete.
Non-streamed requests have no client TTFT / ITL, only e2e.

Every request asks the server for its token IDs and its own timings
(`return_token_ids`, `return_metrics`), so the two views can be compared.

Chat templates differ in what conversations they take: Mistral's refuses a system message, and some
templates require user and assistant turns to alternate. A chat request that a server refuses (400)
while it holds a system message is sent once more with the system message folded into the first user
turn (`fold_system_message`: what those models' own clients do); the endpoint and model are then
remembered, so later chats to them go folded at once (one refused request per template, not one per
request), and the result says so (`adapted`). Timings are the successful attempt's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from engine.traffic.loadgen.workloads import RequestSpec


@dataclass
class RequestResult:
    request_id: str
    workload: str
    endpoint: str
    replica: str
    api: str
    stream: bool
    start_time: float  # epoch seconds when sent
    ok: bool = False
    status: int = 0
    error: str = ""
    ttft: float | None = None  # client-side, seconds
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    server: dict | None = None  # the server's `metrics` object
    adapted: str = ""  # how the request was changed for the server's chat template ("" when sent as given)

    @property
    def mean_itl(self) -> float | None:
        return sum(self.itl) / len(self.itl) if self.itl else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean_itl"] = self.mean_itl
        return d


def _path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def _tokens_in(choice: dict, api: str) -> int:
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids)
    text = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
    return 1 if text else 0


FOLDED = "system message folded into the first user turn (the chat template refused it)"
# (endpoint, model) whose chat template refused a system message: their chats are folded from then on
_FOLDING: set[tuple[str, str]] = set()


def fold_system_message(messages: list[dict]) -> list[dict] | None:
    """The conversation with its system message(s) put at the start of the first user turn (a blank
    line between), for templates without a system role; None when it holds no system message."""
    systems = [m for m in messages if m.get("role") == "system"]
    if not systems:
        return None
    text = "\n\n".join(str(m.get("content") or "") for m in systems)
    rest = [m for m in messages if m.get("role") != "system"]
    if not rest or rest[0].get("role") != "user":
        return [{"role": "user", "content": text}, *rest]
    content = rest[0].get("content") or ""
    if isinstance(content, list):  # content parts: the system text as a first text part
        merged = [{"type": "text", "text": text + "\n\n"}, *content]
    else:
        merged = f"{text}\n\n{content}"
    return [dict(rest[0], content=merged), *rest[1:]]


async def send(client: httpx.AsyncClient, endpoint: str, replica: str, model: str, spec: RequestSpec,
               request_id: str, api_key: str | None = None, timeout: float = 300.0,
               first_token: asyncio.Event | None = None) -> RequestResult:
    """`first_token`, when given, is set once the first output token streams back (the request is
    decoding), or when the request ends without one. A chat with a system message that the server
    refuses is sent once more with it folded into the first user turn (see the module's doc)."""
    folded = fold_system_message(spec.body.get("messages") or []) if spec.api == "chat" else None
    key = (endpoint, model)
    if folded is not None and key in _FOLDING:
        result = await _send(client, endpoint, replica, model, spec, request_id, api_key, timeout, first_token,
                             folded)
        result.adapted = FOLDED
        return result
    result = await _send(client, endpoint, replica, model, spec, request_id, api_key, timeout, first_token, None)
    if folded is None or result.status != 400:
        return result
    retry = await _send(client, endpoint, replica, model, spec, request_id, api_key, timeout, first_token, folded)
    if not retry.ok:  # refused either way: the first refusal says why
        return result
    _FOLDING.add(key)
    retry.adapted = FOLDED
    return retry


async def _send(client: httpx.AsyncClient, endpoint: str, replica: str, model: str, spec: RequestSpec,
                request_id: str, api_key: str | None, timeout: float, first_token: asyncio.Event | None,
                messages: list[dict] | None) -> RequestResult:
    body = dict(spec.body, model=model, stream=spec.stream, return_token_ids=True, return_metrics=True)
    if messages is not None:
        body["messages"] = messages
    headers = {"X-Request-Id": request_id, "X-Workload": spec.workload}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    result = RequestResult(request_id, spec.workload, endpoint, replica, spec.api, spec.stream, time.time())
    t0 = time.perf_counter()
    try:
        if spec.stream:
            await _stream(client, endpoint + _path(spec.api), body, headers, timeout, result, t0, first_token)
        else:
            resp = await client.post(endpoint + _path(spec.api), json=body, headers=headers, timeout=timeout)
            result.status = resp.status_code
            data = resp.json()
            if resp.status_code != 200:
                result.error = data.get("error", {}).get("message", resp.text[:200])
            else:
                choice = data["choices"][0]
                result.finish_reason = choice.get("finish_reason")
                result.output_tokens = data["usage"]["completion_tokens"]
                result.prompt_tokens = data["usage"]["prompt_tokens"]
                result.server = data.get("metrics")
                result.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if first_token is not None:
            first_token.set()
    result.e2e = time.perf_counter() - t0
    return result


async def _stream(client, url, body, headers, timeout, result: RequestResult, t0: float,
                  first_token: asyncio.Event | None = None) -> None:
    body["stream_options"] = {"include_usage": True}
    last = None
    async with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as resp:
        result.status = resp.status_code
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            try:
                result.error = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                result.error = text[:200]
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(payload)
            if "error" in chunk:
                result.error = chunk["error"].get("message", "stream error")
                return
            if chunk.get("usage"):
                result.prompt_tokens = chunk["usage"]["prompt_tokens"]
            if chunk.get("metrics"):
                result.server = chunk["metrics"]
            for choice in chunk.get("choices", []):
                n = _tokens_in(choice, result.api)
                if n:
                    if result.ttft is None:
                        result.ttft = now - t0
                        if first_token is not None:
                            first_token.set()
                        result.itl.extend([0.0] * (n - 1))  # tokens that came with the first one
                    else:
                        result.itl.extend([(now - last) / n] * n)
                    result.output_tokens += n
                    last = now
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    result.ok = result.finish_reason is not None and not result.error
