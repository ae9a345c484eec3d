"""What continuous cross-scoring costs a fleet: its throughput with the scorer on vs off, side by side.

One fleet (sidecar + two replicas of the reference model, one CPU each), a closed-loop load (the
loadgen's default sampled mix, `--clients` at a time, each request to one replica) that keeps the
replicas busy, in rounds of `--seconds`: off, on, off, on ... (interleaved, so the host's drift falls
on both sides). In an "on" round the cross-scorer (engine/probe/cross_scoring.py, the settings `fleet
up` uses unless told otherwise) runs beside the load; it looks only at requests that finished in that
round. Printed: requests/s and output tokens/s per round, the median on/off ratio over the pairs and its
range, and what the scorer sent (requests, tokens) against what the fleet served.

    python -m diagnostics.benchmarks.cross_score_cost [--pairs 3] [--seconds 30] [--clients 4]
                                                       [--share 0.05] [--token-share 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from engine.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.fleet.cross_score_spec import CrossScoreSpec
from engine.fleet.fleet import fleet_down, fleet_up
from engine.fleet.models import REFERENCE_MODEL
from engine.loadgen.arrivals import Arrival
from engine.loadgen.runner import run_load
from engine.loadgen.workloads import make_workload
from engine.probe.cross_scoring import DEFAULT_SHARE, DEFAULT_TOKEN_SHARE, CrossScoreSettings, cross_score_every
from telemetry.store import open_store

ENGINE = {"served_model_name": "reference", "max_num_seqs": 8, "num_kv_blocks": 128, "block_size": 16}
PASS_SECONDS = 4.0  # passes within a round, so the round's own traffic is scored while it runs
SETTLE = 2.0  # the replicas flush every second


async def _round(urls, store_url, seconds: float, clients: int, seed: int, settings: CrossScoreSettings | None):
    stop = asyncio.Event()
    passes = []
    scorer = None
    start = time.time()
    store = open_store(store_url) if settings else None
    try:
        if settings:
            scorer = asyncio.create_task(cross_score_every(lambda: urls, store, settings, stop, report=passes.append,
                                                           start=start + settings.interval + settings.settle))
        load = await run_load(urls, make_workload("mixed", seed), Arrival("closed", concurrency=clients),
                              duration=seconds, seed=seed, pick="random", run_id=f"cost{seed}", request_timeout=120.0)
    finally:
        stop.set()
        if scorer is not None:
            await scorer
        if store is not None:
            store.close()
    ok = [r for r in load.results if r.ok]
    return {"requests_s": len(ok) / load.wall_seconds, "tokens_s": sum(r.output_tokens for r in ok) / load.wall_seconds,
            "requests": len(ok), "served_tokens": sum(r.prompt_tokens + r.output_tokens for r in ok),
            "scored": sum(sum(p.picked.values()) for p in passes), "rescore_tokens": sum(p.tokens for p in passes),
            "failed": sum(len(p.failed) for p in passes)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="off/on round pairs")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of load per round")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients over the fleet")
    parser.add_argument("--share", type=float, default=DEFAULT_SHARE)
    parser.add_argument("--token-share", type=float, default=DEFAULT_TOKEN_SHARE)
    args = parser.parse_args(argv)
    settings = CrossScoreSettings(args.share, args.token_share, PASS_SECONDS, settle=SETTLE)
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="infersight-xcost-") as work:
        replicas = [ReplicaSpec(id=f"r{i}", model=str(REFERENCE_MODEL), cpus=str(cpus[i % len(cpus)]), threads=1,
                                engine=dict(ENGINE), drain_timeout=3.0) for i in range(2)]
        config = FleetConfig(name="xcost", run_dir=Path(work) / "fleet", startup_timeout=240.0, stop_timeout=10.0,
                             sidecar=SidecarSpec(port=0), replicas=replicas,
                             cross_score=CrossScoreSpec(enabled=False))  # this benchmark runs it, round by round
        state = fleet_up(config)
        try:
            urls = [r.url for r in state.replicas]
            asyncio.run(_round(urls, state.store_url, 5.0, args.clients, 999, None))  # warm-up, not counted
            rows = []
            for k in range(args.pairs):
                for side in ("off", "on"):
                    r = asyncio.run(_round(urls, state.store_url, args.seconds, args.clients, 10 * k + (side == "on"),
                                           settings if side == "on" else None))
                    rows.append((k, side, r))
                    print(f"pair {k} {side:3s}: {r['requests_s']:.2f} req/s, {r['tokens_s']:.1f} out tok/s, "
                          f"{r['requests']} requests; scored {r['scored']} ({r['rescore_tokens']} tokens for "
                          f"{r['served_tokens']} served, {r['failed']} failed)", flush=True)
        finally:
            fleet_down(state.run_dir)
    ratios = {m: [on[m] / off[m] for (_, _, off), (_, _, on) in zip(rows[0::2], rows[1::2])]
              for m in ("requests_s", "tokens_s")}
    on_rows = [r for _, side, r in rows if side == "on"]
    served = sum(r["served_tokens"] for r in on_rows)
    print(f"cross-scoring share {args.share:g}, token share {args.token_share:g}; {args.pairs} interleaved pairs of "
          f"{args.seconds:g} s, {args.clients} clients")
    for m, rs in ratios.items():
        print(f"  {m}: on/off median {statistics.median(rs):.3f} (pairs {', '.join(f'{x:.3f}' for x in rs)})")
    print(f"  scored {sum(r['scored'] for r in on_rows)} of {sum(r['requests'] for r in on_rows)} requests; "
          f"{sum(r['rescore_tokens'] for r in on_rows)} rescore tokens for {served} served "
          f"({sum(r['rescore_tokens'] for r in on_rows) / max(1, served):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
