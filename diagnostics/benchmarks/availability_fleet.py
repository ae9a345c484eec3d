"""Availability on real local fleets: every request sent is a row, and the replica that refuses, sheds or fails
more than its peers is named with the outcome and the key that explain it; clean fleets stay quiet.

Replicas of the reference model (256-token context), each scenario a fleet of its own:
- `three`: r0 as shipped, r1 with `max_model_len` 96 (a length limit), r2 with `serve --max-queue 1`;
- `length`, `queue`: a canary pair, baseline and candidate recorded as roles (`--candidate r0|r1`: which one is
  the canary, so the rule cannot lean on the order of the names), started together or `--stagger S` seconds
  apart (the candidate's fleet joins the baseline's store later, as a real deploy does);
- `batched`: the candidate turns chunked prefill off with a 64-token batch budget, an ordinary engine option:
  it refuses every prompt longer than that, an effective length limit under another key;
- `clean`: a pair with one configuration; `skew`: the same pair, r0 sent 70% long prompts and r1 10% (some past
  the model's context, which both refuse): neither may be named;
- `vllm`: r0 (infersight) and v0, vLLM behind its recording proxy with `max_model_len` 96 (vLLM's 400s); half
  way through v0's vLLM process is killed, as a crash does, and its proxy answers 502 (the 5xx of an upstream).

Traffic: sampled (temperature 0.8), load balanced (each request to one replica at random, 6 at a time), 40%
long prompts (~80-440 tokens, as users send them, not fitted to the smallest context: past 256 every replica
refuses them), then bursts of short prompts that hold
their slots (ignore_eos) to every replica at once (under the default queue: a healthy replica sheds none).
Then, by request id, what was sent against what the store holds (the status, per outcome), and
`diagnose availability`: PASS when exactly the expected (replica, outcome) pairs are named, each citing its key.

    python -m diagnostics.benchmarks.availability_fleet --scenario three [--candidate r1] [--stagger 20]
        [--steady 160] [--bursts 3] [--burst-size 30]

`vllm` needs vLLM's CPU build with infersight's plugin: `INFERSIGHT_VLLM_PYTHON` or `<repo>/.venv-vllm`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from diagnostics import availability
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.core.model_refs import REFERENCE_MODEL
from telemetry.contract import outcomes
from telemetry.store import open_store

ENGINE = {"served_model_name": "reference", "max_num_seqs": 8, "num_kv_blocks": 128, "block_size": 16}
WORDS = "the cat sat on a mat and then it ran far away from the dog".split()
LENGTH = {"max_model_len": 96}
QUEUE = ["--max-queue", "1"]
NO_CHUNKING = {"enable_chunked_prefill": False, "max_num_batched_tokens": 64}


@dataclass
class Scenario:
    """replica -> (engine options, serve args); the pairs (replica, outcome kind) that must be named, each with
    a text its finding must hold; the share of long prompts per replica (default 0.4)."""

    replicas: dict[str, tuple[dict, list]]
    expected: dict[tuple[str, str], str]
    long_share: dict[str, float] = field(default_factory=dict)
    canary: bool = False  # two replicas with roles: --candidate, --stagger apply
    vllm: dict[str, dict] = field(default_factory=dict)  # vLLM replicas: id -> vllm options
    kill_upstream_at: float | None = None  # share of the steady traffic after which vLLM's process is killed


def scenario(name: str, candidate: str) -> Scenario:
    baseline = "r0" if candidate == "r1" else "r1"
    pair = lambda engine, args: {baseline: ({}, []), candidate: (engine, args)}  # noqa: E731
    return {
        "three": lambda: Scenario({"r0": ({}, []), "r1": (LENGTH, []), "r2": ({}, QUEUE)},
                                  {("r1", "length"): "max_model_len 96", ("r2", "shed"): "max_queue 1"}),
        "length": lambda: Scenario(pair(LENGTH, []), {(candidate, "length"): "max_model_len 96"}, canary=True),
        "queue": lambda: Scenario(pair({}, QUEUE), {(candidate, "shed"): "max_queue 1"}, canary=True),
        "batched": lambda: Scenario(pair(NO_CHUNKING, []), {(candidate, "length"): "max_num_batched_tokens 64"},
                                    canary=True),
        "clean": lambda: Scenario(pair({}, []), {}, canary=True),
        "skew": lambda: Scenario({"r0": ({}, []), "r1": ({}, [])}, {}, long_share={"r0": 0.7, "r1": 0.1}),
        "vllm": lambda: Scenario({"r0": ({}, [])}, {("v0", "length"): "max_model_len", ("v0", "failed"): ""},
                                 vllm={"v0": {"max_model_len": 96, "max_num_seqs": 8}}, kill_upstream_at=0.5),
    }[name]()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def drive(urls: dict[str, str], steady: int, bursts: int, burst_size: int, long_share: dict[str, float],
                seed: int = 40, halfway=None) -> list[tuple]:
    """(request id, replica, status, API error code) of every request sent; `halfway()` runs once half the
    steady traffic is sent."""
    rng, sent = random.Random(seed), []

    async def one(client, request_id, replica, burst):
        long = not burst and rng.random() < long_share.get(replica, 0.4)
        body = {"model": "reference", "prompt": _text(rng, rng.randint(40, 200) if long else rng.randint(5, 35)),
                "max_tokens": 40 if burst else 8, "temperature": 0.8, "ignore_eos": burst}
        try:
            r = await client.post(urls[replica] + "/v1/completions", json=body, timeout=300,
                                  headers={"X-Request-Id": request_id, "X-Workload": rng.choice(["chat", "batch"])})
            sent.append((request_id, replica, r.status_code, _api_code(r)))
        except httpx.HTTPError as e:
            sent.append((request_id, replica, -1, type(e).__name__))

    run = f"avail-{int(time.time())}"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=400)) as client:
        gate = asyncio.Semaphore(6)

        async def paced(i):
            async with gate:
                await one(client, f"{run}-s{i}", rng.choice(list(urls)), False)

        half = steady // 2 if halfway else steady
        await asyncio.gather(*(paced(i) for i in range(half)))
        if halfway:
            halfway()
            await asyncio.gather(*(paced(i) for i in range(half, steady)))
        for b in range(bursts):
            await asyncio.gather(*(one(client, f"{run}-b{b}-{i}-{rid}", rid, True) for rid in urls
                                   for i in range(burst_size)))
            await asyncio.sleep(2)
    return sent


def _api_code(response: httpx.Response):
    if response.status_code == 200:
        return None
    try:
        return (response.json().get("error") or {}).get("code")
    except ValueError:
        return None


def check(store, sent: list[tuple], timeout: float = 90.0) -> tuple[list[tuple], dict]:
    """The requests whose row is missing or says another status than the client got ((id, replica, status and
    code the client got, the stored status)), and per outcome (by the stored code) the requests sent and the rows
    found for them."""
    ids = [s[0] for s in sent]
    deadline = time.monotonic() + timeout
    while True:
        rows = store.query_df("SELECT request_id, replica_id, http_status, error_code, finish_reason FROM requests "
                              "WHERE request_id IN {ids:Array(String)}", {"ids": ids})
        if len(rows) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(1)
    stored = {(r["request_id"], r["replica_id"]): r for r in rows.to_dict("records")}
    bad, per_outcome = [], collections.defaultdict(lambda: [0, 0])
    for request_id, replica, status, code in sent:
        row = stored.get((request_id, replica))
        got = None if row is None else (row["http_status"] or (200 if row["error_code"] == "" else 0))
        outcome = outcomes.outcome_of(row["error_code"], row["finish_reason"]) if row is not None else f"HTTP {status}"
        per_outcome[outcome][0] += 1
        per_outcome[outcome][1] += row is not None
        if got != status:
            bad.append((request_id, replica, status, code, got))
    if len(rows) != len(sent):
        bad.append(("rows", "", len(sent), len(rows)))
    return bad, dict(per_outcome)


def _replica(rid: str, engine: dict, args: list, role: str) -> ReplicaSpec:
    return ReplicaSpec(id=rid, model=str(REFERENCE_MODEL), threads=1, engine={**ENGINE, **engine},
                       drain_timeout=3.0, args=list(args), role=role)


def _vllm_replica(rid: str, options: dict) -> ReplicaSpec:
    return ReplicaSpec(id=rid, model=str(REFERENCE_MODEL), threads=1, kind="vllm", drain_timeout=3.0,
                       vllm={"served_model_name": "reference", **options}, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                       vllm_python=os.environ.get("INFERSIGHT_VLLM_PYTHON"))


def start(plan: Scenario, candidate: str, stagger: float, work: Path) -> list:
    """The fleets of a scenario (a staggered canary: the candidate's joins the baseline's store later)."""
    specs = []
    for rid, (engine, args) in plan.replicas.items():
        role = ("candidate" if rid == candidate else "baseline") if plan.canary else ""
        specs.append(_replica(rid, engine, args, role))
    specs += [_vllm_replica(rid, options) for rid, options in plan.vllm.items()]
    common = dict(startup_timeout=900.0, stop_timeout=10.0, log_level="warning")  # vLLM on a busy CPU: minutes
    if not (plan.canary and stagger > 0):
        return [fleet_up(FleetConfig(name="availability", run_dir=work / "fleet", sidecar=SidecarSpec(port=0),
                                     replicas=specs, **common))]
    first = fleet_up(FleetConfig(name="availability", run_dir=work / "fleet", sidecar=SidecarSpec(port=0),
                                 replicas=[s for s in specs if s.id != candidate], **common))
    time.sleep(stagger)
    try:
        return [first, fleet_up(FleetConfig(name="availability-canary", run_dir=work / "canary",
                                            sidecar=SidecarSpec(enabled=False, url=first.store_url),
                                            replicas=[s for s in specs if s.id == candidate], **common))]
    except BaseException:
        fleet_down(first.run_dir)
        raise


def judge(findings: list, expected: dict[tuple[str, str], str]) -> list[str]:
    """What is wrong with the findings: an expected pair not named (or named without its key), one named that
    should not be."""
    named = {(f.subject, f.evidence["outcome"]): f for f in findings if f.kind == availability.KIND
             and f.severity != "info"}
    problems = [f"not named: {pair}" for pair in expected if pair not in named]
    problems += [f"named without {key!r}: {pair}" for pair, key in expected.items()
                 if pair in named and key not in named[pair].summary]
    problems += [f"named but healthy: {pair}" for pair in named if pair not in expected]
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="three",
                        choices=("three", "length", "queue", "batched", "clean", "skew", "vllm"))
    parser.add_argument("--candidate", choices=("r0", "r1"), default="r1", help="the canary of a pair")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between the baseline's and the "
                                                                   "candidate's start (a pair)")
    parser.add_argument("--steady", type=int, default=160)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--burst-size", type=int, default=30)
    args = parser.parse_args(argv)
    plan = scenario(args.scenario, args.candidate)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="availability-fleet-"))
    since = time.time() - 1
    fleets = start(plan, args.candidate, args.stagger, work)
    try:
        urls = {r.name: r.url for f in fleets for r in f.replicas}
        upstreams = [u for f in fleets for u in f.upstreams]
        halfway = (lambda: [os.kill(u.pid, signal.SIGKILL) for u in upstreams]) \
            if plan.kill_upstream_at is not None else None
        sent = asyncio.run(drive(urls, args.steady, args.bursts, args.burst_size, plan.long_share,
                                 halfway=halfway))
        with open_store(fleets[0].store_url) as store:
            bad, per_outcome = check(store, sent)
            print(f"{args.scenario} (candidate {args.candidate}, stagger {args.stagger:g} s): {len(sent)} requests "
                  f"sent; {len(sent) - len(bad)} with their row as the client was answered")
            print("  by outcome (sent / rows): " +
                  ", ".join(f"{o} {s}/{r}" for o, (s, r) in sorted(per_outcome.items())))
            for b in bad[:10]:
                print("  mismatch:", b)
            scope = Scope(start=since)
            print(availability.replica_table(store, scope))
            findings = availability.run(store, DiagnosticRequest(scope))
            for f in findings:
                print(f"{f.severity:8s} {f.kind} {f.subject}: {f.summary}")
    finally:
        for f in reversed(fleets):
            fleet_down(f.run_dir)
    problems = judge(findings, plan.expected) + [f"{len(bad)} requests without their row"] * bool(bad)
    print(("PASS" if not problems else "FAIL: " + "; ".join(problems)) +
          f" ({args.scenario}, {time.monotonic() - began:.0f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
