"""Sending stored prompts to a deployment: greedy completions of token-ID prompts over HTTP.

Every request goes to /v1/completions with `prompt` as the stored token IDs (the server takes
them as they are: no tokenizer, no chat template in between), `temperature` 0, and the stored
`max_tokens`, `ignore_eos`, stop strings and stop token IDs, so the output is comparable token by
token with the stored one. At most `concurrency` requests are in flight. A request that fails
(refused, timed out, the connection dropped) becomes an answer with its error: the replay goes on.
A deployment that does not answer /v1/models at all is a ConnectionError before anything is sent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from evals.backends import HttpBackend, _error_message
from evals.replay.stored import REPLAY_WORKLOAD, StoredRequest


@dataclass
class Deployment:
    url: str
    model: str  # the served model name (/v1/models)
    replica_id: str = ""  # what its /health reports ("" when it does not)


@dataclass
class Answer:
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    latency_seconds: float = 0.0
    error: str = ""


def normalize_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def completion_body(request: StoredRequest, model: str) -> dict:
    """The stored request as a greedy token-ID completion with its own limits."""
    p = request.params
    body = {"model": model, "prompt": request.prompt_token_ids, "temperature": 0.0,
            "max_tokens": p.get("max_tokens"),  # None: the server fills the rest of the context, as it did
            "ignore_eos": bool(p.get("ignore_eos", False)), "return_token_ids": True, "logprobs": 0}
    if p.get("stop"):
        body["stop"] = list(p["stop"])
    if p.get("stop_token_ids"):
        body["stop_token_ids"] = list(p["stop_token_ids"])
    return body


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def discover(client: httpx.AsyncClient, url: str, what: str, api_key: str | None = None) -> Deployment:
    """Who serves at `url` (its model, its replica id); ConnectionError naming `what` when nobody does."""
    url = normalize_url(url)
    try:
        r = await client.get(url + "/v1/models", headers=_headers(api_key), timeout=10)
        r.raise_for_status()
        model = r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ConnectionError(f"cannot reach the {what} at {url}: /v1/models did not answer with a served model "
                              f"({type(e).__name__}: {e})") from None
    replica = ""
    try:
        replica = str((await client.get(url + "/health", timeout=10)).json().get("replica_id") or "")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass  # not an infersight replica: its identity is its URL
    return Deployment(url, model, replica)


async def complete(client: httpx.AsyncClient, target: Deployment, body: dict, request_id: str,
                   api_key: str | None = None, timeout: float = 300.0) -> Answer:
    headers = {**_headers(api_key), "X-Request-Id": request_id, "X-Workload": REPLAY_WORKLOAD}
    t0 = time.perf_counter()
    try:
        r = await client.post(target.url + "/v1/completions", json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        return Answer(latency_seconds=time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - t0
    if r.status_code != 200:
        return Answer(latency_seconds=latency, error=f"HTTP {r.status_code}: {_error_message(r)}")
    try:
        gen = HttpBackend.parse(r.json())
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return Answer(latency_seconds=latency, error=f"unreadable response ({type(e).__name__}: {e})")
    return Answer(gen.output_token_ids, gen.text, gen.logprobs, gen.finish_reason, latency)


async def complete_all(client: httpx.AsyncClient, target: Deployment, bodies: list[dict], request_ids: list[str],
                       concurrency: int, api_key: str | None = None, timeout: float = 300.0,
                       on_done=None) -> list[Answer]:
    """Every body to `target`, at most `concurrency` at a time; answers in the order of `bodies`."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict, request_id: str) -> Answer:
        async with gate:
            answer = await complete(client, target, body, request_id, api_key, timeout)
        if on_done:
            on_done(answer)
        return answer

    return list(await asyncio.gather(*(one(b, i) for b, i in zip(bodies, request_ids))))
