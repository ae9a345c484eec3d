"""Continuous cross-scoring: a small share of each replica's production requests, scored by a peer.

The rescore round (engine/traffic/probe/rescore.py) is an on-demand sample; this is the same measurement
running all the time, so a replica whose weights differ (int4, a noisy checkpoint, a changed RoPE
base) is seen from the traffic it serves, with no probe pinned and no greedy request.

Every `interval` seconds a pass looks at the requests that finished since the last one (a settle
delay behind now, so their rows have reached the store). A request is picked when a hash of its id
falls in the `share` (deterministic: every scorer process and every restart picks the same ones,
and the pick is an unbiased sample of the replica's traffic). Only requests with their sampled tokens'
logprobs recorded can be scored (diagnostics/rescore.py compares them); a recording proxy asks for them
on a share of its requests only (a vLLM replica's `logprobs`, 0.25 by default), so the hash share is taken
of those, scaled up to keep `share` of all the replica's scorable requests (a uniform share of a uniform
share: still an unbiased sample, at the same cost). Each pick, prompt + output token IDs,
goes teacher-forced with prompt logprobs (max_tokens 1, temperature 0) to one peer serving the same
model (chosen by the same hash, so over picks every peer is used) and to the serving replica itself:
the self-rescoring is the numerical floor diagnostics/rescore.py compares against. Requests
are `X-Workload: rescore`, which every traffic statistic leaves out.

Cost is bounded twice: the share of requests, and a token ledger per model. Each pass grants
`token_share` x the prompt + output tokens the model's replicas served in the window; a pick is sent
only when its tokens on both scorers fit what was granted and not yet spent (unused grant carries
over, so a quiet minute followed by a busy one still scores at the share). Picks that do not fit are
counted, never queued. Low priority: one rescore request at a time per scorer, so a replica never has
more than one of them beside its production batch.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

from engine.traffic.loadgen.runner import Endpoint
from engine.serving.fleet.cross_score_spec import (
    DEFAULT_INTERVAL, DEFAULT_SHARE, DEFAULT_TOKEN_SHARE, SETTLE_SECONDS, CrossScoreSettings,
)
from engine.traffic.probe.rescore import (
    MIN_OUTPUT_TOKENS, Pick, by_served_model, discover_replicas, picks_of, score_one,
)
from telemetry.contract.probes import ACTIVE_WORKLOADS_SQL, RESCORE_ORIGINAL_SQL, RESCORE_WORKLOAD, round_id
from telemetry.store import StoreError

_PPM = 1_000_000
_SALT = "cross-score"

# the requests of one replica and model in the window that could be scored: finished, long enough, and room for
# the teacher-forced request on the scorer (both queries below read exactly these)
_SCORABLE_WHERE = f"""
WHERE replica_id = {{replica:String}} AND model_name = {{model:String}}
  AND finish_time >= {{since:Float64}} AND finish_time < {{until:Float64}}
  AND workload NOT IN {ACTIVE_WORKLOADS_SQL} AND finish_reason IN ('stop', 'length')
  AND length(output_token_ids) >= {MIN_OUTPUT_TOKENS}
  AND length(prompt_token_ids) + length(output_token_ids) + 1 <= {{max_len:UInt64}}
"""
_MEASURED = "length(output_logprobs) = length(output_token_ids)"  # its sampled tokens' logprobs recorded
_PICK = f"""
SELECT request_id, prompt_token_ids, output_token_ids
FROM requests {_SCORABLE_WHERE}
  AND {_MEASURED}
  AND cityHash64('{_SALT}', request_id) % {_PPM} < {{share_ppm:UInt64}}
  AND request_id NOT IN (SELECT {RESCORE_ORIGINAL_SQL} FROM requests
                         WHERE workload = '{RESCORE_WORKLOAD}' AND arrival_time >= {{since:Float64}})
ORDER BY cityHash64('{_SALT}', request_id)
"""
# how many could be scored, and how many of those have their logprobs (the pick's share is scaled by the two)
_SCORABLE = f"""
SELECT count() AS scorable, countIf({_MEASURED}) AS measured
FROM requests {_SCORABLE_WHERE}
"""
_SERVED = f"""
SELECT sum(prompt_tokens + output_tokens) AS tokens
FROM requests
WHERE model_name = {{model:String}} AND has({{replicas:Array(String)}}, replica_id)
  AND finish_time >= {{since:Float64}} AND finish_time < {{until:Float64}}
  AND workload NOT IN {ACTIVE_WORKLOADS_SQL}
"""


@dataclass
class TokenLedger:
    """Tokens granted (token_share x tokens served) and spent, per model, over the scorer's life."""

    granted: float = 0.0
    spent: int = 0

    def grant(self, tokens: float) -> None:
        self.granted += tokens

    def spend(self, tokens: int) -> bool:
        if self.spent + tokens > self.granted:
            return False
        self.spent += tokens
        return True


@dataclass
class CrossScorePass:
    pass_id: str
    since: float
    until: float
    replicas: list[str] = field(default_factory=list)
    picked: dict[str, int] = field(default_factory=dict)  # served replica -> picks sent
    over_budget: int = 0  # picks the ledger had no tokens for
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    tokens: int = 0  # sent this pass, both scorers
    served_tokens: int = 0  # what the window's traffic was
    errors: list[str] = field(default_factory=list)  # replicas not reached

    def to_dict(self) -> dict:
        return asdict(self)

    def one_line(self) -> str:
        return (f"cross-scoring {self.pass_id}: {sum(self.picked.values())} requests of {len(self.replicas)} "
                f"replicas, {self.sent} sent, {len(self.failed)} failed, {self.tokens} tokens for "
                f"{self.served_tokens} served, {self.over_budget} over budget")


def peer_for(request_id: str, peers: list[Endpoint]) -> Endpoint:
    """The peer that scores a pick: fixed by its id, spread over the peers."""
    return peers[zlib.crc32(request_id.encode()) % len(peers)]


def served_tokens(store, model: str, replicas: list[str], since: float, until: float) -> int:
    rows = store.query_arrow(_SERVED, {"model": model, "replicas": replicas, "since": since,
                                       "until": until}).to_pylist()
    return int(rows[0]["tokens"] or 0) if rows else 0


def pick_share(store, endpoint: Endpoint, since: float, until: float, share: float, max_len: int) -> list[Pick]:
    """`share` of the replica's scorable requests in the window, drawn from those with logprobs recorded."""
    window = {"replica": endpoint.replica, "model": endpoint.model, "since": since, "until": until, "max_len": max_len}
    counts = store.query_arrow(_SCORABLE, window).to_pylist()
    scorable, measured = (int(counts[0]["scorable"]), int(counts[0]["measured"])) if counts else (0, 0)
    if measured == 0:
        return []
    of_measured = min(1.0, share * scorable / measured)
    return picks_of(endpoint, store.query_arrow(_PICK, {**window, "share_ppm": int(round(of_measured * _PPM))}))


def plan(store, found: list[Endpoint], since: float, until: float, settings: CrossScoreSettings,
         ledgers: dict[str, TokenLedger], out: CrossScorePass) -> dict[str, list[Pick]]:
    """scorer replica -> the picks it scores this pass (each pick: one peer and its own replica)."""
    by_id = {e.replica: e for e in found}
    work: dict[str, list[Pick]] = {}
    for model, group in sorted(by_served_model(found).items()):
        if len(group) < 2:
            continue
        ledger = ledgers.setdefault(model, TokenLedger())
        served = served_tokens(store, model, [e.replica for e in group], since, until)
        out.served_tokens += served
        ledger.grant(settings.token_share * served)
        max_len = min((e.max_model_len for e in group if e.max_model_len), default=1 << 30)
        out.picked.update({e.replica: 0 for e in group})
        # the replicas' picks taken in turn, so a budget that binds leaves every replica its part
        for p in _in_turn([pick_share(store, e, since, until, settings.share, max_len) for e in group]):
            if not ledger.spend(2 * p.tokens):
                out.over_budget += 1
                continue
            peer = peer_for(p.request_id, [g for g in group if g.replica != p.replica])
            for scorer in (peer.replica, p.replica):
                work.setdefault(scorer, []).append(p)
            out.tokens += 2 * p.tokens
            out.picked[p.replica] += 1
    return {s: picks for s, picks in work.items() if s in by_id}


def _in_turn(lists: list[list[Pick]]) -> list[Pick]:
    return [p for row in itertools.zip_longest(*lists) for p in row if p is not None]


async def cross_score_pass(client, urls: list[str], store, since: float, until: float,
                           settings: CrossScoreSettings, ledgers: dict[str, TokenLedger], api_key=None,
                           request_timeout: float = 60.0) -> CrossScorePass:
    out = CrossScorePass(round_id(time.time()), since, until)
    found, out.errors = await discover_replicas(client, urls, api_key)
    out.replicas = [e.replica for e in found]
    work = plan(store, found, since, until, settings, ledgers, out)
    by_id = {e.replica: e for e in found}

    async def scorer(replica: str, picks: list[Pick]) -> None:
        for p in picks:  # one at a time: a scorer never has two rescore requests beside its traffic
            error = await score_one(client, by_id[replica], p, out.pass_id, api_key, request_timeout)
            out.sent += 1
            if error:
                out.failed.append(error)

    await asyncio.gather(*(scorer(r, picks) for r, picks in work.items()))
    return out


async def cross_score_every(urls_now: Callable[[], list[str]], store, settings: CrossScoreSettings,
                            stop: asyncio.Event, report: Callable[[CrossScorePass], None] = lambda p: None,
                            on_error: Callable[[Exception], None] = lambda e: None, api_key=None,
                            max_passes: int | None = None, start: float | None = None) -> dict[str, TokenLedger]:
    """Passes every `settings.interval` until `stop` (or `max_passes`); the ledgers per model.
    The first pass looks back one interval from `start` (default: now)."""
    ledgers: dict[str, TokenLedger] = {}
    since = (start if start is not None else time.time()) - settings.interval - settings.settle
    passes = 0
    async with httpx.AsyncClient(timeout=60.0) as client:
        while not stop.is_set():
            began = time.monotonic()
            until = time.time() - settings.settle
            try:
                report(await cross_score_pass(client, urls_now(), store, since, until, settings, ledgers, api_key))
                since = until
            except (RuntimeError, OSError, httpx.HTTPError, StoreError) as e:  # the next pass tries the window again
                on_error(e)
            passes += 1
            if max_passes is not None and passes >= max_passes:
                break
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, settings.interval - (time.monotonic() - began)))
            except TimeoutError:
                pass
    return ledgers
