"""One rescore round (cross-scoring): requests a replica served, scored teacher-forced by every replica.

For each replica R (found as the prober finds them: id from /health, model from /v1/models), up to
`per_replica` of its recent requests are read from the store: client traffic only (workload not in
ACTIVE_WORKLOADS), finished (stop / length), at least MIN_OUTPUT_TOKENS output tokens and one
recorded output logprob per output token, not rescored by an earlier round. They are picked by a
hash of (round, request id), so a round is an unbiased sample of R's recent traffic and later
rounds move on. Each is sent to every replica S serving the same model, R itself included (the
self-rescoring control), as

    POST /v1/completions {"prompt": prompt_token_ids + output_token_ids, "max_tokens": 1,
                          "temperature": 0, "prompt_logprobs": 0}
    X-Workload: rescore, X-Request-Id: rescore.<round>.<S>.<original request id>

S's row (requests.prompt_logprobs) then holds the logprob of every output token R sampled, under
S's weights: diagnostics/rescore.py compares it with R's output_logprobs. The token budget
bounds a round: a pick costs (prompt + output + 1) tokens on every scorer; picks are taken in hash
order while they fit, the rest are counted as skipped. Scorers run in parallel, `concurrency`
requests in flight on each.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field

import httpx

from engine.traffic.loadgen.client import send
from engine.traffic.loadgen.runner import Endpoint, discover
from engine.traffic.loadgen.workloads import RequestSpec
from telemetry.contract.probes import (
    ACTIVE_WORKLOADS_SQL,
    RESCORE_ORIGINAL_SQL,
    RESCORE_WORKLOAD,
    rescore_request_id,
    round_id,
)
from telemetry.store import open_store

MIN_OUTPUT_TOKENS = 2  # one token says little; diagnostics/rescore.py averages over the output positions
DEFAULT_TOKEN_BUDGET = 200_000
DEFAULT_WINDOW_SECONDS = 3600.0  # "recent": requests that arrived this long before the round, at most

_PICK = f"""
SELECT request_id, prompt_token_ids, output_token_ids
FROM requests
WHERE replica_id = {{replica:String}} AND model_name = {{model:String}}
  AND arrival_time >= {{since:Float64}}
  AND workload NOT IN {ACTIVE_WORKLOADS_SQL} AND finish_reason IN ('stop', 'length')
  AND length(output_token_ids) >= {MIN_OUTPUT_TOKENS} AND length(output_logprobs) = length(output_token_ids)
  AND length(prompt_token_ids) + length(output_token_ids) + 1 <= {{max_len:UInt64}}
  AND request_id NOT IN (SELECT {RESCORE_ORIGINAL_SQL} FROM requests
                         WHERE workload = '{RESCORE_WORKLOAD}' AND arrival_time >= {{since:Float64}})
ORDER BY cityHash64({{round:String}}, request_id)
LIMIT {{n:UInt64}}
"""


@dataclass
class Pick:
    replica: str  # the replica that served it (R)
    request_id: str
    token_ids: list[int]  # prompt + output: the scorers' prompt

    @property
    def tokens(self) -> int:
        return len(self.token_ids) + 1


@dataclass
class RescoreRound:
    round_id: str
    start_time: float
    token_budget: int
    replicas: list[str] = field(default_factory=list)
    picked: dict[str, int] = field(default_factory=dict)  # served replica -> requests picked
    skipped_budget: int = 0  # picks left out: the budget was spent
    sent: int = 0
    failed: list[str] = field(default_factory=list)  # "request id: why"
    tokens: int = 0
    errors: list[str] = field(default_factory=list)  # replicas not reached
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def one_line(self) -> str:
        return (f"rescore round {self.round_id}: {sum(self.picked.values())} requests x {len(self.replicas)} scorers, "
                f"{self.sent} sent, {len(self.failed)} failed, {self.tokens} tokens, "
                f"{self.skipped_budget} over budget, {self.seconds:.1f} s")


@contextlib.contextmanager
def _store(target):
    """A store URL / directory is opened (and closed) here; an open store (in-process callers) is used as is."""
    if hasattr(target, "query_arrow"):
        yield target
        return
    with open_store(target) as store:
        yield store


def pick_requests(store, endpoint: Endpoint, round_: str, per_replica: int, window_s: float, max_len: int
                  ) -> list[Pick]:
    return picks_of(endpoint, store.query_arrow(_PICK, {"replica": endpoint.replica, "model": endpoint.model,
                                                        "since": time.time() - window_s, "max_len": max_len,
                                                        "round": round_, "n": per_replica}))


def picks_of(endpoint: Endpoint, table) -> list[Pick]:
    """Rows of (request_id, prompt_token_ids, output_token_ids) that `endpoint` served, as picks."""
    return [Pick(endpoint.replica, r["request_id"], list(r["prompt_token_ids"]) + list(r["output_token_ids"]))
            for r in table.to_pylist()]


async def discover_replicas(client, urls: list[str], api_key=None) -> tuple[list[Endpoint], list[str]]:
    """(each replica once, "url: why" for those that did not answer /health and /v1/models)."""
    found: list[Endpoint] = []
    errors: list[str] = []
    for url in dict.fromkeys(u.rstrip("/") for u in urls):
        try:
            (e,) = await discover(client, [url], api_key)
        except RuntimeError as err:
            errors.append(f"{url}: {err}")
            continue
        if all(f.replica != e.replica for f in found):  # the same replica twice: once
            found.append(e)
    return found, errors


def by_served_model(endpoints: list[Endpoint]) -> dict[str, list[Endpoint]]:
    groups: dict[str, list[Endpoint]] = {}
    for e in endpoints:
        groups.setdefault(e.model, []).append(e)
    return groups


async def score_one(client, scorer: Endpoint, pick: Pick, round_: str, api_key, timeout: float) -> str:
    """Send one pick, teacher-forced with prompt logprobs, to `scorer`; "" or "request id: why it failed"."""
    rid = rescore_request_id(round_, scorer.replica, pick.request_id)
    spec = RequestSpec(RESCORE_WORKLOAD, "completions",
                       {"prompt": pick.token_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}, False)
    r = await send(client, scorer.url, scorer.replica, scorer.model, spec, rid, api_key, timeout)
    return "" if r.ok else f"{rid}: {r.error or r.status}"


async def _score_on(client, scorer: Endpoint, picks: list[Pick], round_: str, out: RescoreRound, api_key,
                    timeout: float, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(p: Pick) -> None:
        async with gate:
            error = await score_one(client, scorer, p, round_, api_key, timeout)
        out.sent += 1
        out.tokens += p.tokens
        if error:
            out.failed.append(error)

    await asyncio.gather(*(one(p) for p in picks))


async def rescore_round(endpoints: list[str], store_url, per_replica: int = 16, *,
                        token_budget: int = DEFAULT_TOKEN_BUDGET, window_s: float = DEFAULT_WINDOW_SECONDS,
                        concurrency: int = 4, api_key: str | None = None, request_timeout: float = 60.0
                        ) -> RescoreRound:
    started = time.time()
    out = RescoreRound(round_id(started), started, token_budget)
    async with httpx.AsyncClient(timeout=request_timeout) as client:
        found, out.errors = await discover_replicas(client, endpoints, api_key)
        out.replicas = [e.replica for e in found]
        by_model = by_served_model(found)
        picks: dict[str, list[Pick]] = {}  # scorer replica -> picks it scores
        with _store(store_url) as store:
            for model, group in by_model.items():
                max_len = min((e.max_model_len for e in group if e.max_model_len), default=1 << 30)
                for e in group:
                    mine = pick_requests(store, e, out.round_id, per_replica, window_s, max_len)
                    out.picked[e.replica] = len(mine)
                    for s in group:
                        picks.setdefault(s.replica, []).extend(mine)
        # the budget over all picks of the round (each pick goes to all its model's scorers)
        flat = [(e, p) for e in found for p in picks.get(e.replica, [])]
        kept, spent = set(), 0
        for e, p in flat:
            if (p.replica, p.request_id) in kept:
                continue
            scorers = len(by_model[e.model])
            if spent + p.tokens * scorers <= token_budget:
                kept.add((p.replica, p.request_id))
                spent += p.tokens * scorers
        out.skipped_budget = len({(p.replica, p.request_id) for _, p in flat} - kept)
        await asyncio.gather(*(
            _score_on(client, e, [p for p in picks.get(e.replica, []) if (p.replica, p.request_id) in kept],
                      out.round_id, out, api_key, request_timeout, concurrency) for e in found))
    out.seconds = time.time() - started
    return out


def run_rescore_round(endpoints: list[str], store_url: str, per_replica: int = 16, **options) -> RescoreRound:
    """`rescore_round` from synchronous code (options as there)."""
    return asyncio.run(rescore_round(endpoints, store_url, per_replica, **options))
