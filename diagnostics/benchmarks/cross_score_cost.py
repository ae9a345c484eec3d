"""What continuous cross-scoring costs a fleet: its throughput with the scorer on vs off, side by side.

One fleet (sidecar + two replicas of the reference model, one CPU each), a closed-loop load (the
loadgen's default sampled mix, `--clients` at a time, each request to one replica) that keeps the
replicas busy, in rounds of `--seconds`: off, on, off, on ... (interleaved, so the host's drift falls
on both sides). In an "on" round the cross-scorer runs beside the load: the process `fleet up` starts
(`infersight probe --fleet ... --cross-score`, engine/traffic/probe/cross_scoring.py) with the fleet's share and
token share, passes every 4 s; it is stopped at the round's end. Printed: requests/s and output tokens/s per round, the median on/off ratio over the pairs and its
range, and what the scorer sent (requests, tokens) against what the fleet served.

    python -m diagnostics.benchmarks.cross_score_cost [--pairs 3] [--seconds 30] [--clients 4]
                                                       [--share 0.05] [--token-share 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec
from engine.serving.fleet.cross_score_spec import CrossScoreSettings, CrossScoreSpec
from engine.serving.fleet.fleet import fleet_down, fleet_up, prober_command
from engine.core.model_refs import REFERENCE_MODEL
from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import make_workload
from engine.traffic.probe.cross_scoring import DEFAULT_SHARE, DEFAULT_TOKEN_SHARE
from telemetry.contract.probes import RESCORE_WORKLOAD
from telemetry.store import open_store

ENGINE = {"served_model_name": "reference", "max_num_seqs": 8, "num_kv_blocks": 128, "block_size": 16}
PASS_SECONDS = 4.0  # several passes within a round


def _round(state, seconds: float, clients: int, seed: int, scorer: CrossScoreSpec | None) -> dict:
    """One round of load; with `scorer`, the fleet's cross-scorer (the process `fleet up` starts) runs beside it."""
    urls = [r.url for r in state.replicas]
    proc = None
    start = time.time()
    if scorer is not None:
        log = Path(state.run_dir) / "logs" / f"scorer-{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(prober_command(Path(state.run_dir), None, scorer), stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
    try:
        load = asyncio.run(run_load(urls, make_workload("mixed", seed), Arrival("closed", concurrency=clients),
                                    duration=seconds, seed=seed, pick="random", run_id=f"cost{seed}",
                                    request_timeout=120.0))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    ok = [r for r in load.results if r.ok]
    with open_store(state.store_url) as store:
        sent = store.query_arrow(f"SELECT count() AS n, sum(prompt_tokens + 1) AS t FROM requests WHERE workload = "
                                 f"'{RESCORE_WORKLOAD}' AND arrival_time >= {{a:Float64}} AND arrival_time < "
                                 f"{{b:Float64}}", {"a": start, "b": time.time()}).to_pylist()[0]
    return {"requests_s": len(ok) / load.wall_seconds, "tokens_s": sum(r.output_tokens for r in ok) / load.wall_seconds,
            "requests": len(ok), "served_tokens": sum(r.prompt_tokens + r.output_tokens for r in ok),
            "scored": int(sent["n"] or 0), "rescore_tokens": int(sent["t"] or 0), "failed": 0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="off/on round pairs")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of load per round")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients over the fleet")
    parser.add_argument("--share", type=float, default=DEFAULT_SHARE)
    parser.add_argument("--token-share", type=float, default=DEFAULT_TOKEN_SHARE)
    args = parser.parse_args(argv)
    scorer = CrossScoreSpec(settings=CrossScoreSettings(share=args.share, token_share=args.token_share,
                                                         interval=PASS_SECONDS))
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="infersight-xcost-") as work:
        replicas = [ReplicaSpec(id=f"r{i}", model=str(REFERENCE_MODEL), cpus=str(cpus[i % len(cpus)]), threads=1,
                                engine=dict(ENGINE), drain_timeout=3.0) for i in range(2)]
        config = FleetConfig(name="xcost", run_dir=Path(work) / "fleet", startup_timeout=240.0, stop_timeout=10.0,
                             sidecar=SidecarSpec(port=0), replicas=replicas,
                             cross_score=CrossScoreSpec(enabled=False))  # this benchmark runs it, round by round
        state = fleet_up(config)
        try:
            _round(state, 5.0, args.clients, 999, None)  # warm-up, not counted
            rows = []
            for k in range(args.pairs):
                for side in ("off", "on"):
                    r = _round(state, args.seconds, args.clients, 10 * k + (side == "on"),
                                scorer if side == "on" else None)
                    rows.append((k, side, r))
                    print(f"pair {k} {side:3s}: {r['requests_s']:.2f} req/s, {r['tokens_s']:.1f} out tok/s, "
                          f"{r['requests']} requests; rescore requests {r['scored']} ({r['rescore_tokens']} "
                          f"tokens for {r['served_tokens']} served)", flush=True)
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
    print(f"  {sum(r['scored'] for r in on_rows)} rescore requests beside {sum(r['requests'] for r in on_rows)} served; "
          f"{sum(r['rescore_tokens'] for r in on_rows)} rescore tokens for {served} served "
          f"({sum(r['rescore_tokens'] for r in on_rows) / max(1, served):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
