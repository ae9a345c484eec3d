"""Drive one or more replicas with a workload under an arrival process.

Open loop (poisson, burst): requests leave on schedule whether or not earlier
ones finished; closed loop: N clients, each sends its next request when the
last one returns. The run ends after `duration` seconds of sending or
`num_requests` requests; requests in flight then finish (bounded by the
request timeout). Endpoints are used round-robin or at random.

Duplicates: a `duplicate_share` of the prompts also goes, with the same body, to a
second replica (another replica id than the picked one, drawn by a seeded generator
of its own), under the request id `<id>-dup`: two replicas answering one prompt is
what the replica and tokenizer diagnostics compare exactly. It needs two replicas
at least; asking for duplicates with one is an error (a run that silently measures
no pair would look like a clean result). `num_requests` counts prompts, so a run
returns one result more per duplicated prompt.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import httpx

from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.client import RequestResult, send
from engine.traffic.loadgen.fit import fit_scale
from engine.traffic.loadgen.workloads import Workload, check_share

DUPLICATE_SUFFIX = "-dup"
# the context the prompts are fitted to: the endpoints' smallest, their largest, or none
FIT_CHOICES = ("smallest", "largest", "none")


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


class _Duplicator:
    """Which prompts also go to a second replica, and to which one (seeded, apart from the picker)."""

    def __init__(self, endpoints: list[Endpoint], share: float, seed: int):
        self.endpoints, self.share = endpoints, share
        self.rng = random.Random(f"duplicate:{seed}")
        if share > 0 and len({e.replica for e in endpoints}) < 2:
            raise ValueError(f"duplicate share {share:g} needs endpoints of two replicas at least; got "
                             f"{', '.join(sorted({e.replica for e in endpoints}))} (give more --endpoints, "
                             f"or a duplicate share of 0)")

    def __call__(self, picked: Endpoint) -> Endpoint | None:
        if not self.share or self.rng.random() >= self.share:
            return None
        return self.rng.choice([e for e in self.endpoints if e.replica != picked.replica])


async def run_load(urls: list[str], workload: Workload, arrival: Arrival, *, duration: float | None = None,
                   num_requests: int | None = None, seed: int = 0, pick: str = "round-robin",
                   api_key: str | None = None, request_timeout: float = 300.0, run_id: str | None = None,
                   progress=None, max_in_flight: int = 1024, fit_context: bool | str = "smallest",
                   duplicate_share: float = 0.0) -> LoadResult:
    """Run the load; `progress(result)` is called as each request finishes.

    `fit_context` (FIT_CHOICES; True is "smallest", False "none"): prompts are first scaled down (if needed)
    to fit the smallest context among the endpoints, or the largest, where a replica with a shorter limit
    refuses what the others answer (see engine/traffic/loadgen/fit.py). ValueError on knobs that cannot run."""
    fit = {True: "smallest", False: "none"}.get(fit_context, fit_context)
    if fit not in FIT_CHOICES:
        raise ValueError(f"fit the prompts to one of {', '.join(FIT_CHOICES)}, got {fit_context!r}")
    if duration is None and num_requests is None:
        raise ValueError("give a duration or a number of requests")
    check_share(duplicate_share, "duplicate share")
    if duplicate_share > 0 and len({u.rstrip("/") for u in urls}) < 2:  # fail before any traffic
        raise ValueError(f"duplicate share {duplicate_share:g} needs two endpoints at least (two replicas to "
                         f"send each duplicated prompt to); got {len(urls)}")
    run_id = run_id or f"lg{seed}-{int(time.time() * 1000) % 10**9:09d}"
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=request_timeout) as client:
        endpoints = await discover(client, urls, api_key)
        if fit != "none" and all(e.max_model_len for e in endpoints):
            target = (min if fit == "smallest" else max)(endpoints, key=lambda e: e.max_model_len)
            scale = await fit_scale(client, target.url, target.model, target.max_model_len, workload, api_key)
            if scale != workload.scale:
                workload = workload.rescaled(scale)
        picker = _Picker(endpoints, pick, seed)
        duplicator = _Duplicator(endpoints, duplicate_share, seed)
        results: list[RequestResult] = []
        counter = itertools.count()
        start = time.monotonic()

        def more() -> bool:
            if num_requests is not None and len(issued) >= num_requests:
                return False
            return duration is None or time.monotonic() - start < duration

        async def to(endpoint: Endpoint, spec, request_id: str) -> None:
            result = await send(client, endpoint.url, endpoint.replica, endpoint.model, spec, request_id, api_key,
                                request_timeout)
            results.append(result)
            if progress:
                progress(result)

        async def one() -> None:
            i = next(counter)
            endpoint = picker()
            spec = workload.next()
            twin = duplicator(endpoint)
            request_id = f"{run_id}-{i:06d}"
            if twin is None:
                await to(endpoint, spec, request_id)
            else:  # the same body, sent to both at once (send copies it, so neither sees the other's fields)
                await asyncio.gather(to(endpoint, spec, request_id), to(twin, spec, request_id + DUPLICATE_SUFFIX))

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
    config = {"workload": workload.name, "prompt_scale": workload.scale, "fit": fit, "arrival": arrival.describe(),
              "temperature": workload.temperature, "greedy_share": workload.greedy_share,
              "duplicate_share": duplicate_share, "duration": duration,
              "num_requests": num_requests, "seed": seed, "pick": pick, "run_id": run_id,
              "endpoints": [e.__dict__ for e in endpoints]}
    return LoadResult(sorted(results, key=lambda r: r.request_id), wall, endpoints, config)
