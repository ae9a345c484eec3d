"""Fit a workload into the replicas' context length before sending it.

The workloads are text; how many tokens a text becomes depends on the model's
tokenizer, and small models have small contexts (the reference model: 256
tokens). So before a run, sampled requests are tokenized by the replica itself
(POST /tokenize), and the prompt scale shrinks until every sample's prompt
plus its max_tokens fits (with 5% to spare). The run reports the scale it used. A chat the
template refuses with its system message is measured as it will be sent: folded into the first
user turn (engine.traffic.loadgen.client).
"""

from __future__ import annotations

import asyncio

import httpx

from engine.traffic.loadgen.client import fold_system_message
from engine.traffic.loadgen.workloads import RequestSpec, Workload, make_workload

SAMPLES = 120  # enough for the agent sessions to grow to their longest
SHRINK = 0.85
CONCURRENCY = 16  # tokenize calls in flight
HEADROOM = 0.95  # the run draws more requests than were sampled: keep 5% of the context spare


async def prompt_tokens(client: httpx.AsyncClient, url: str, model: str, spec: RequestSpec,
                        headers: dict) -> int:
    body = {"model": model}
    if spec.api == "chat":
        body["messages"] = spec.body["messages"]
    else:
        body["prompt"] = spec.body["prompt"]
    resp = await client.post(url + "/tokenize", json=body, headers=headers, timeout=30)
    folded = fold_system_message(body["messages"]) if spec.api == "chat" else None
    if resp.status_code == 400 and folded is not None:  # as the request will be sent (client.send)
        resp = await client.post(url + "/tokenize", json=dict(body, messages=folded), headers=headers, timeout=30)
    if resp.status_code != 200:
        raise RuntimeError(f"{url}/tokenize answered {resp.status_code}: {resp.text[:200]}")
    return int(resp.json()["count"])


async def longest_request(client, url: str, model: str, workload: Workload, headers: dict,
                          samples: int = SAMPLES) -> int:
    """The most tokens (prompt + max_tokens) any of `samples` requests of `workload` can need."""
    specs = [workload.next() for _ in range(samples)]
    limit = asyncio.Semaphore(CONCURRENCY)

    async def need(spec: RequestSpec) -> int:
        async with limit:
            return await prompt_tokens(client, url, model, spec, headers) + spec.body["max_tokens"]

    return max(await asyncio.gather(*(need(spec) for spec in specs)))


async def fit_scale(client: httpx.AsyncClient, url: str, model: str, max_model_len: int, workload: Workload,
                    api_key: str | None = None) -> float:
    """The largest prompt scale (at most the workload's own) at which its requests fit the context."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    budget = HEADROOM * max_model_len
    scale = workload.scale
    for _ in range(15):
        trial = make_workload(workload.name, workload.seed, scale, workload.max_tokens, workload.ignore_eos)
        worst = await longest_request(client, url, model, trial, headers)
        if worst <= budget:
            return scale
        # requests grow about linearly with the scale: jump close, then shrink step by step
        scale *= min(SHRINK, budget / worst)
    raise RuntimeError(f"the {workload.name} workload does not fit the {max_model_len}-token context even with "
                       f"prompts scaled by {scale:.3f}; lower --max-tokens")
