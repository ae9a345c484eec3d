"""`infersight calibrate`: one replica's capacity under a latency SLO.

Sweep the request rate on one replica (Poisson arrivals, a bounded time per
rate, each rate a little higher than the last), measure p95 TTFT and ITL at
each, and report the highest rate that still met both SLOs: the replica's
capacity. With --target-rate, also the replicas that rate needs (capacity
scales out linearly while replicas share nothing but the sidecar).

    infersight calibrate --endpoint http://127.0.0.1:8101 --slo-ttft-p95 0.5 --slo-itl-p95 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.traffic.loadgen.arrivals import Arrival
from engine.traffic.loadgen.cli import add_load_arguments
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.stats import percentiles
from engine.traffic.loadgen.workloads import make_workload


@dataclass
class RatePoint:
    rate: float  # offered, requests / s
    achieved: float  # finished requests / s
    requests: int
    errors: int
    ttft_p95: float | None
    itl_p95: float | None
    e2e_p95: float | None
    meets_slo: bool


def rates(start: float, factor: float, max_rate: float) -> list[float]:
    out, r = [], start
    while r <= max_rate * (1 + 1e-9):
        out.append(round(r, 4))
        r *= factor
    return out


async def measure(endpoint: str, rate: float, seconds: float, args, seed: int) -> RatePoint:
    workload = make_workload(args.workload, seed, args.prompt_scale, args.max_tokens, not args.respect_eos)
    load = await run_load([endpoint], workload, Arrival("poisson", rate=rate), duration=seconds, seed=seed,
                          api_key=args.api_key, request_timeout=args.request_timeout, fit_context=args.fit_context)
    ok = [r for r in load.results if r.ok]
    ttft = percentiles([r.ttft if r.ttft is not None else r.e2e for r in ok])["p95"]
    itl = percentiles([x for r in ok for x in r.itl])["p95"]
    e2e = percentiles([r.e2e for r in ok])["p95"]
    errors = len(load.results) - len(ok)
    meets = (bool(ok) and errors == 0 and ttft is not None and ttft <= args.slo_ttft_p95
             and (itl is None or itl <= args.slo_itl_p95))
    return RatePoint(rate, len(ok) / load.wall_seconds if load.wall_seconds else 0.0, len(load.results), errors,
                     ttft, itl, e2e, meets)


async def fit_once(args) -> None:
    """Fit the prompts into the replica's context once, not at every rate."""
    import httpx

    from engine.traffic.loadgen.fit import fit_scale
    from engine.traffic.loadgen.runner import discover

    async with httpx.AsyncClient() as client:
        endpoint = (await discover(client, [args.endpoint], args.api_key))[0]
        if endpoint.max_model_len:
            workload = make_workload(args.workload, args.seed, args.prompt_scale, args.max_tokens, not args.respect_eos)
            args.prompt_scale = await fit_scale(client, endpoint.url, endpoint.model, endpoint.max_model_len,
                                                workload, args.api_key)
    args.fit_context = "none"


async def sweep(args) -> list[RatePoint]:
    if args.fit_context != "none":
        await fit_once(args)
    print(f"prompt scale {args.prompt_scale:.3g}")
    print(HEADER)
    points: list[RatePoint] = []
    failures = 0
    for i, rate in enumerate(rates(args.start_rate, args.factor, args.max_rate)):
        point = await measure(args.endpoint, rate, args.seconds_per_rate, args, args.seed + i)
        points.append(point)
        print(_row(point), flush=True)
        failures = failures + 1 if not point.meets_slo else 0
        if failures >= args.patience:  # past the knee: higher rates only queue more
            break
    return points


def capacity(points: list[RatePoint]) -> float:
    """The highest rate that met the SLO below the first rate that did not (0 if none did)."""
    best = 0.0
    for p in points:
        if not p.meets_slo:
            break
        best = p.rate
    return best


def capacity_line(points: list[RatePoint], cap: float) -> str:
    """What to print about the capacity: when no rate missed the SLO, the sweep stopped at its own
    --max-rate ceiling, so `cap` is a lower bound, not the knee, and the line says so."""
    if not cap:
        return "capacity: the SLO is not met even at the lowest rate; lower --start-rate or relax the SLO"
    line = f"capacity: {cap:g} requests/s per replica under the SLO"
    if ceiling_reached(points):
        line += (f" -- the --max-rate ceiling ({points[-1].rate:g}/s) was reached without breaching the SLO: "
                 "a lower bound, raise --max-rate to find the real capacity")
    return line


def ceiling_reached(points: list[RatePoint]) -> bool:
    return bool(points) and all(p.meets_slo for p in points)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:8.1f}"


HEADER = f"{'rate/s':>8} {'done/s':>8} {'req':>5} {'err':>4} {'ttft p95':>9} {'itl p95':>9} {'e2e p95':>9}  slo"


def _row(p: RatePoint) -> str:
    return (f"{p.rate:8.3g} {p.achieved:8.3g} {p.requests:5d} {p.errors:4d} {_ms(p.ttft_p95):>9} "
            f"{_ms(p.itl_p95):>9} {_ms(p.e2e_p95):>9}  {'ok' if p.meets_slo else 'MISS'}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, help="one replica's URL")
    parser.add_argument("--slo-ttft-p95", type=float, required=True, help="seconds")
    parser.add_argument("--slo-itl-p95", type=float, required=True, help="seconds")
    parser.add_argument("--start-rate", type=float, default=0.5, help="requests/s of the first step")
    parser.add_argument("--factor", type=float, default=1.5, help="each rate is the last times this")
    parser.add_argument("--max-rate", type=float, default=64.0)
    parser.add_argument("--seconds-per-rate", type=float, default=20.0)
    parser.add_argument("--patience", type=int, default=1, help="stop after this many rates in a row miss the SLO")
    parser.add_argument("--target-rate", type=float, default=None, help="requests/s the fleet must serve")
    parser.add_argument("--out", type=Path, default=None, help="write the curve as JSON")
    add_load_arguments(parser)
    parser.set_defaults(workload="chat")


def run(args) -> int:
    if args.factor <= 1.0 or args.start_rate <= 0 or args.seconds_per_rate <= 0:
        print("infersight calibrate: need --factor > 1, --start-rate > 0, --seconds-per-rate > 0", file=sys.stderr)
        return 2
    print(f"calibrating {args.endpoint}: {args.workload} workload, SLO p95 TTFT <= {args.slo_ttft_p95 * 1000:g} ms, "
          f"p95 ITL <= {args.slo_itl_p95 * 1000:g} ms, {args.seconds_per_rate:g} s per rate")
    try:
        points = asyncio.run(sweep(args))
    except RuntimeError as e:
        print(f"infersight calibrate: {e}", file=sys.stderr)
        return 1
    cap = capacity(points)
    print("\n" + capacity_line(points, cap))
    needed = None
    if args.target_rate and cap:
        needed = math.ceil(args.target_rate / cap)
        print(f"replicas needed for {args.target_rate:g} requests/s: {needed}")
    if args.out:
        args.out.write_text(json.dumps({"endpoint": args.endpoint, "slo": {"ttft_p95": args.slo_ttft_p95,
                                        "itl_p95": args.slo_itl_p95}, "capacity": cap, "replicas_needed": needed,
                                        "capacity_is_lower_bound": ceiling_reached(points),
                                        "points": [asdict(p) for p in points]}, indent=1))
    return 0
