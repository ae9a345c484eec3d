"""One probe round: the suite, on every replica, alone and inside a busy batch.

For each replica (found as the loadgen finds them: id from /health, model from /v1/models), every
planned probe is sent in suite order, one at a time:
- "solo": alone, so on an otherwise idle replica it runs at batch size 1;
- "batched": `batch_fillers` filler requests at once, streamed (request ids probe.<round>.filler_<n>.
  batched.<replica>, long: budget.filler_run_tokens), then, once each has streamed its first token, the
  probe, so it shares every step with them (keep batch_fillers below the replica's max_num_seqs for all to
  fit in one batch); once the probe is answered the fillers' streams are closed, which aborts them.
So at most 1 + batch_fillers probe requests are in flight on a replica at any time, and a round
takes only a small, bounded slice of its capacity; the token budget (budget.py) bounds the rest.
Replicas are probed in parallel. A replica that does not answer (/health, or any probe: connection
refused, timeout) is given up on for this round, reported with why, and the others go on; an
HTTP error on one probe (4xx, 5xx) fails that probe only.
A chat probe whose system message the replica's template refuses (Mistral's) is sent with it folded
into the first user turn, as loadgen does (engine.traffic.loadgen.client.send), and its result says so.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import httpx

from engine.traffic.loadgen.client import RequestResult, send
from engine.traffic.loadgen.runner import Endpoint, discover
from engine.traffic.loadgen.workloads import RequestSpec
from engine.traffic.probe.budget import Planned, Skipped, filler_run_tokens, plan_round
from engine.traffic.probe.measure import measure_suite
from engine.traffic.probe.results import ProbeResult, ProbeRound, ReplicaRound
from engine.traffic.probe.suite import SUITE, check_suite, filler_body
from telemetry.contract.probes import FILLER_PREFIX, MODES, PROBE_WORKLOAD, probe_request_id, round_id

FILLERS_START_TIMEOUT = 10.0  # seconds the probe waits for its fillers to be decoding


def _result(planned: Planned, r: RequestResult) -> ProbeResult:
    return ProbeResult(planned.probe.probe_id, planned.mode, r.request_id, r.ok, r.status, r.error, r.prompt_tokens,
                       r.output_tokens, r.finish_reason, r.e2e, r.adapted)


async def _send_batched(client, endpoint: Endpoint, planned: Planned, request_id: str, filler_ids: list[str],
                        filler_tokens: int, api_key, timeout: float, spec: RequestSpec
                        ) -> tuple[RequestResult, list[RequestResult]]:
    """The probe and the fillers that finished on their own (the others were stopped: not failures)."""
    # the fillers first, streamed, and the probe once each has its first token back: they are then
    # decoding, and they are long enough to still be decoding when the probe is admitted, so the probe
    # shares all of its steps with them; then they are stopped. (Fillers only a little longer than the
    # probe were done before a fast model admitted it, one HTTP round trip later, and it ran alone.)
    started = [asyncio.Event() for _ in filler_ids]
    fillers = [asyncio.create_task(send(client, endpoint.url, endpoint.replica, endpoint.model,
                                        RequestSpec(PROBE_WORKLOAD, "completions", filler_body(i, filler_tokens), True),
                                        fid, api_key, timeout, first_token=event))
               for i, (fid, event) in enumerate(zip(filler_ids, started))]
    try:  # bounded: a replica that queues the fillers still gets its probe
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), FILLERS_START_TIMEOUT)
    except asyncio.TimeoutError:
        pass
    probe = await send(client, endpoint.url, endpoint.replica, endpoint.model, spec, request_id, api_key, timeout)
    for task in fillers:
        task.cancel()  # closing its stream aborts it on the replica (a row with outcome "aborted")
    finished = await asyncio.gather(*fillers, return_exceptions=True)
    return probe, [f for f in finished if isinstance(f, RequestResult)]


async def probe_replica(client: httpx.AsyncClient, endpoint: Endpoint, sends: list[Planned], round_: str, *,
                        batch_fillers: int = 4, filler_prompt_tokens: int = 0, api_key: str | None = None,
                        request_timeout: float = 60.0) -> ReplicaRound:
    out = ReplicaRound(endpoint.url, endpoint.replica, endpoint.model)
    filler_numbers = itertools.count()
    for planned in sends:
        if out.error:
            out.not_sent.append(Skipped(planned.probe.probe_id, planned.mode, "the replica stopped answering"))
            continue
        request_id = probe_request_id(round_, planned.probe.probe_id, planned.mode, endpoint.replica)
        spec = RequestSpec(PROBE_WORKLOAD, planned.probe.api, planned.body, planned.probe.stream)
        if planned.mode == "solo":
            result = await send(client, endpoint.url, endpoint.replica, endpoint.model, spec, request_id, api_key,
                                request_timeout)
        else:
            filler_ids = [probe_request_id(round_, f"{FILLER_PREFIX}{next(filler_numbers)}", "batched",
                                           endpoint.replica) for _ in range(batch_fillers)]
            filler_tokens = filler_run_tokens(planned.probe, filler_prompt_tokens, endpoint.max_model_len)
            result, fillers = await _send_batched(client, endpoint, planned, request_id, filler_ids, filler_tokens,
                                                  api_key, request_timeout, spec)
            out.fillers_sent += len(filler_ids)
            out.fillers_failed += sum(not f.ok for f in fillers)
        out.results.append(_result(planned, result))
        if result.status == 0:  # no HTTP answer at all: the replica is gone (or hung) for this round
            out.error = f"stopped answering at {planned.probe.probe_id} ({planned.mode}): {result.error}"
    return out


async def probe_round(urls: list[str], suite=None, *, modes=MODES, token_budget: int | None = None,
                      batch_fillers: int = 4, api_key: str | None = None, request_timeout: float = 60.0
                      ) -> ProbeRound:
    """One round of `suite` (default: the shipped SUITE) on every replica at `urls`."""
    suite = SUITE if suite is None else tuple(suite)
    check_suite(suite)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"probe modes {list(modes)}: give some of {', '.join(MODES)}")
    if batch_fillers < 0:
        raise ValueError("batch_fillers must be 0 or more")
    urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
    started = time.time()
    out = ProbeRound(round_id(started), started, token_budget=token_budget)
    limits = httpx.Limits(max_connections=max(8, len(urls) * (1 + batch_fillers)))
    async with httpx.AsyncClient(limits=limits, timeout=request_timeout) as client:
        rounds: dict[str, ReplicaRound] = {}
        endpoints: list[Endpoint] = []
        for url in urls:
            try:
                (endpoint,) = await discover(client, [url], api_key)
            except RuntimeError as e:
                rounds[url] = ReplicaRound(url, error=str(e))
                continue
            twin = next((e for e in endpoints if e.replica == endpoint.replica), None)
            if twin:  # the same replica twice would send the same request ids twice
                rounds[url] = ReplicaRound(url, endpoint.replica, endpoint.model,
                                           error=f"the same replica as {twin.url}: probed there")
                continue
            endpoints.append(endpoint)
        if endpoints:
            known = [e for e in endpoints if e.max_model_len] or endpoints
            tightest = min(known, key=lambda e: e.max_model_len)
            measured, filler_tokens = await measure_suite(client, tightest, suite, api_key)
            plan = plan_round(measured, replicas=len(endpoints), modes=tuple(modes), token_budget=token_budget,
                              batch_fillers=batch_fillers, filler_prompt_tokens=filler_tokens,
                              max_model_len=tightest.max_model_len)
            out.skipped, out.planned_tokens = plan.skipped, plan.tokens
            done = await asyncio.gather(*(probe_replica(client, e, plan.sends, out.round_id,
                                                        batch_fillers=batch_fillers,
                                                        filler_prompt_tokens=filler_tokens, api_key=api_key,
                                                        request_timeout=request_timeout) for e in endpoints))
            rounds.update({e.url: r for e, r in zip(endpoints, done)})
    out.replicas = [rounds[url] for url in urls]
    out.seconds = time.time() - started
    return out


def run_probe_round(urls: list[str], suite=None, **options) -> ProbeRound:
    """`probe_round` from synchronous code (options as there)."""
    return asyncio.run(probe_round(urls, suite, **options))
