"""Drive one or more replicas with a workload under an arrival process.

Open loop (poisson, burst): requests leave on schedule whether or not earlier
ones finished; closed loop: N clients, each sends its next request when the
last one returns. The run ends after `duration` seconds of sending or
`num_requests` requests; requests in flight then finish (bounded by the
request timeout). Endpoints are used round-robin or at random.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import httpx

from engine.loadgen.arrivals import Arrival
from engine.loadgen.client import RequestResult, send
from engine.loadgen.fit import fit_scale
from engine.loadgen.workloads import Workload, make_workload


@dataclass
class Endpoint:
    url: str
    replica: str  # the replica id it reports on /health
    model: str  # the served model name it reports on /v1/models
    max_model_len: int = 0  # its context length (0: not reported)


@dataclass
class LoadResult:
    results: list[RequestResult]
    wall_seconds: float
    endpoints: list[Endpoint]
    config: dict = field(default_factory=dict)


async def discover(client: httpx.AsyncClient, urls: list[str], api_key: str | None = None) -> list[Endpoint]:
    """Ask each endpoint who it is (replica id, model): results are grouped by it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    endpoints = []
    for url in urls:
        url = url.rstrip("/")
        try:
            health = (await client.get(url + "/health", timeout=10)).json()
            models = (await client.get(url + "/v1/models", headers=headers, timeout=10)).json()
            card = models["data"][0]
            endpoints.append(Endpoint(url, health.get("replica_id", url), card["id"],
                                      int(card.get("max_model_len") or 0)))
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            raise RuntimeError(f"{url}: not an infersight replica that answers /health and /v1/models ({e})") from None
    return endpoints


class _Picker:
    def __init__(self, endpoints: list[Endpoint], how: str, seed: int):
        self.endpoints, self.how = endpoints, how
        self.rng = random.Random(f"pick:{seed}")
        self.cycle = itertools.cycle(endpoints)

    def __call__(self) -> Endpoint:
        return self.rng.choice(self.endpoints) if self.how == "random" else next(self.cycle)


async def run_load(urls: list[str], workload: Workload, arrival: Arrival, *, duration: float | None = None,
                   num_requests: int | None = None, seed: int = 0, pick: str = "round-robin",
                   api_key: str | None = None, request_timeout: float = 300.0, run_id: str | None = None,
                   progress=None, max_in_flight: int = 1024, fit_context: bool = True) -> LoadResult:
    """Run the load; `progress(result)` is called as each request finishes.

    With `fit_context`, prompts are first scaled down (if needed) to fit the smallest context
    among the endpoints (see engine/loadgen/fit.py)."""
    if duration is None and num_requests is None:
        raise ValueError("give a duration or a number of requests")
    run_id = run_id or f"lg{seed}-{int(time.time() * 1000) % 10**9:09d}"
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=request_timeout) as client:
        endpoints = await discover(client, urls, api_key)
        if fit_context and all(e.max_model_len for e in endpoints):
            tightest = min(endpoints, key=lambda e: e.max_model_len)
            scale = await fit_scale(client, tightest.url, tightest.model, tightest.max_model_len, workload, api_key)
            if scale != workload.scale:
                workload = make_workload(workload.name, workload.seed, scale, workload.max_tokens, workload.ignore_eos)
        picker = _Picker(endpoints, pick, seed)
        results: list[RequestResult] = []
        counter = itertools.count()
        start = time.monotonic()

        def more() -> bool:
            if num_requests is not None and len(issued) >= num_requests:
                return False
            return duration is None or time.monotonic() - start < duration

        async def one() -> None:
            i = next(counter)
            endpoint = picker()
            spec = workload.next()
            result = await send(client, endpoint.url, endpoint.replica, endpoint.model, spec,
                                f"{run_id}-{i:06d}", api_key, request_timeout)
            results.append(result)
            if progress:
                progress(result)

        issued: list[asyncio.Task] = []
        if arrival.open_loop:
            for offset in arrival.offsets(seed):
                delay = start + offset - time.monotonic()
                if duration is not None and offset >= duration:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                if not more():
                    break
                issued.append(asyncio.create_task(one()))
        else:
            async def client_loop() -> None:
                while more():
                    task = asyncio.ensure_future(one())
                    issued.append(task)
                    await task

            await asyncio.gather(*(client_loop() for _ in range(arrival.concurrency)))
        if issued:
            await asyncio.gather(*issued, return_exceptions=True)
        wall = time.monotonic() - start
    config = {"workload": workload.name, "prompt_scale": workload.scale, "arrival": arrival.describe(),
              "duration": duration,
              "num_requests": num_requests, "seed": seed, "pick": pick, "run_id": run_id,
              "endpoints": [e.__dict__ for e in endpoints]}
    return LoadResult(sorted(results, key=lambda r: r.request_id), wall, endpoints, config)
