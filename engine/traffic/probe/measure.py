"""Prompt lengths for the budget, and the near-context prompt, asked of a replica's /tokenize.

Measured once per round on the replica with the smallest context (as the loadgen fits its
workloads: engine/traffic/loadgen/fit.py), and the same texts go to every replica, so replicas of one
model get byte-identical probes. The near-context prompt repeats its probe's `fill` text until
prompt + max_tokens reach the context less a margin (another replica's tokenizer may count a
few more tokens). Where /tokenize does not answer, lengths are estimated from the UTF-8 bytes
(an upper bound for byte-level tokenizers) and the near-context probe is skipped.
"""

from __future__ import annotations

import asyncio

import httpx

from engine.traffic.loadgen.fit import prompt_tokens
from engine.traffic.loadgen.runner import Endpoint
from engine.traffic.loadgen.workloads import RequestSpec
from engine.traffic.probe.budget import Measured
from engine.traffic.probe.suite import Probe, filler_body

CHAT_OVERHEAD_TOKENS = 8  # per message, for the estimate: role markers of a chat template
CONCURRENCY = 4  # /tokenize calls in flight


def estimate_tokens(body: dict) -> int:
    if "messages" in body:
        return sum(len(m["content"].encode()) + CHAT_OVERHEAD_TOKENS for m in body["messages"])
    return len(body["prompt"].encode())


def context_margin(max_model_len: int) -> int:
    return max(4, max_model_len // 20)


async def _count(client: httpx.AsyncClient, endpoint: Endpoint, api: str, body: dict, headers: dict) -> int:
    try:
        return await prompt_tokens(client, endpoint.url, endpoint.model, RequestSpec("probe", api, body, False),
                                   headers)
    except (RuntimeError, httpx.HTTPError, ValueError, KeyError):
        return estimate_tokens(body)


async def near_context_prompt(client, endpoint: Endpoint, probe: Probe, headers: dict) -> tuple[str, int] | None:
    """(text, its tokens): `probe.fill` repeated to nearly fill the context; None without /tokenize."""
    target = endpoint.max_model_len - probe.max_tokens - context_margin(endpoint.max_model_len)
    spec = lambda n: RequestSpec("probe", "completions", {"prompt": probe.fill * n}, False)  # noqa: E731
    try:
        one, two = [await prompt_tokens(client, endpoint.url, endpoint.model, spec(n), headers) for n in (1, 2)]
        per = max(1, two - one)  # tokens per repetition; one - per: what the prompt adds around them (BOS)
        n = max(1, (target - (one - per)) // per)
        for _ in range(20):  # the linear guess is close; step down where a merge at the seams made it longer
            count = await prompt_tokens(client, endpoint.url, endpoint.model, spec(n), headers)
            if count <= target or n == 1:
                return probe.fill * n, count
            n -= 1
    except (RuntimeError, httpx.HTTPError, ValueError, KeyError):
        return None
    return None


async def measure_suite(client: httpx.AsyncClient, endpoint: Endpoint, suite, api_key: str | None = None
                        ) -> tuple[list[Measured], int]:
    """(every probe with its body and prompt length, the filler prompt's length), asked of `endpoint`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(probe: Probe) -> Measured:
        async with limit:
            if not probe.fill:
                body = probe.body()
                return Measured(probe, body, await _count(client, endpoint, probe.api, body, headers))
            if not endpoint.max_model_len:
                return Measured(probe, probe.body(""), None, f"{endpoint.replica} reports no context length")
            built = await near_context_prompt(client, endpoint, probe, headers)
            if built is None:
                return Measured(probe, probe.body(""), None, f"{endpoint.url}/tokenize did not answer")
            return Measured(probe, probe.body(built[0]), built[1])

    measured = list(await asyncio.gather(*(one(p) for p in suite)))
    filler = filler_body(0, 1)
    return measured, await _count(client, endpoint, "completions", {"prompt": filler["prompt"]}, headers)
