"""`infersight loadgen`: drive replicas with the field's workloads and report client-side latency.

    infersight loadgen --endpoints http://127.0.0.1:8101,http://127.0.0.1:8102 \\
        --workload mixed --arrival poisson:2 --duration 30 --out results.json
    # a tenth of the requests greedy (replayable token by token), a twentieth sent to two replicas
    infersight loadgen --endpoints URL1,URL2 --workload chat --arrival poisson:2 --duration 30 \\
        --greedy-share 0.1 --duplicate-share 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.runner import FIT_CHOICES, LoadResult, run_load
from engine.traffic.loadgen.stats import format_table, summarize
from engine.traffic.loadgen.workloads import DEFAULT_TEMPERATURE, WORKLOADS, make_workload


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with `calibrate`."""
    parser.add_argument("--workload", choices=list(WORKLOADS), default="mixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-scale", type=float, default=1.0, help="multiply prompt lengths")
    parser.add_argument("--max-tokens", type=int, default=None, help="output tokens of every request")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--request-timeout", type=float, default=300.0)
    fit = parser.add_mutually_exclusive_group()
    fit.add_argument("--fit", dest="fit_context", choices=FIT_CHOICES, default="smallest",
                     help="scale prompts down (asking a replica's /tokenize) until they fit the smallest context "
                          "among the endpoints (default: every replica can answer every request), the largest "
                          "(as the model's users send them: a replica with a shorter limit refuses the longer "
                          "prompts, which is what a length-limit canary must be shown), or none (as they are)")
    fit.add_argument("--no-fit", dest="fit_context", action="store_const", const="none",
                     help="the same as --fit none")
    parser.add_argument("--respect-eos", action="store_true",
                        help="let generation stop at EOS (default: ignore_eos, so lengths are the workload's)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", required=True, help="replica URLs, comma-separated")
    parser.add_argument("--arrival", default="poisson:2", type=parse_arrival,
                        help="poisson:RATE | burst:N@INTERVAL | closed:CONCURRENCY (default poisson:2)")
    stop = parser.add_mutually_exclusive_group(required=True)
    stop.add_argument("--duration", type=float, help="seconds to send requests for")
    stop.add_argument("--num-requests", type=int, help="requests to send")
    parser.add_argument("--pick", choices=("round-robin", "random"), default="round-robin")
    parser.add_argument("--out", type=Path, default=None, help="write every request and the summary as JSON")
    parser.add_argument("--no-progress", action="store_true")
    sampling = parser.add_argument_group("sampling and duplicates")
    sampling.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                          help=f"temperature of the sampled requests (default {DEFAULT_TEMPERATURE:g}: "
                               "production-like)")
    sampling.add_argument("--greedy-share", type=float, default=0.0, metavar="F",
                          help="share of requests sent at temperature 0 (seeded draw; default 0); greedy requests "
                               "are what `infersight replay` compares token by token")
    sampling.add_argument("--duplicate-share", type=float, default=0.0, metavar="F",
                          help="share of prompts also sent, same body, to a second replica as <request id>-dup "
                               "(default 0; needs two replicas at least)")
    add_load_arguments(parser)


def make_progress(total: int | None, enabled: bool, desc: str = "requests"):
    """(callback, close) around a tqdm bar on stderr."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)
    errors = 0

    def update(result) -> None:
        nonlocal errors
        errors += not result.ok
        bar.update(1)
        bar.set_postfix(errors=errors, refresh=False)

    return update, bar.close


def result_json(load: LoadResult, summary: dict) -> dict:
    return {"config": load.config, "wall_seconds": load.wall_seconds, "summary": summary,
            "requests": [r.to_dict() for r in load.results]}


def run(args) -> int:
    urls = [u.strip() for u in args.endpoints.split(",") if u.strip()]
    if not urls:
        print("infersight loadgen: --endpoints is empty", file=sys.stderr)
        return 2
    try:
        workload = make_workload(args.workload, args.seed, args.prompt_scale, args.max_tokens, not args.respect_eos,
                                 greedy_share=args.greedy_share, temperature=args.temperature)
    except ValueError as e:
        print(f"infersight loadgen: {e}", file=sys.stderr)
        return 2
    update, close = make_progress(args.num_requests, not args.no_progress)
    try:
        load = asyncio.run(run_load(urls, workload, args.arrival, duration=args.duration,
                                    num_requests=args.num_requests, seed=args.seed, pick=args.pick,
                                    api_key=args.api_key, request_timeout=args.request_timeout, progress=update,
                                    fit_context=args.fit_context, duplicate_share=args.duplicate_share))
    except ValueError as e:  # knobs the endpoints cannot serve (duplicates over one replica), checked before traffic
        print(f"infersight loadgen: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"infersight loadgen: {e}", file=sys.stderr)
        return 1
    finally:
        close()
    summary = summarize(load.results, load.wall_seconds)
    scale = load.config["prompt_scale"]
    fitted = "" if scale == args.prompt_scale else f" to fit the {args.fit_context} context"
    print(f"{len(load.results)} requests in {load.wall_seconds:.1f} s ({args.workload}, {args.arrival.describe()}, "
          f"{len(urls)} endpoint(s), prompt scale {scale:.3g}{fitted})")
    print(format_table(summary))
    errors = [r for r in load.results if not r.ok]
    for r in errors[:5]:
        print(f"error: {r.request_id} {r.endpoint} status {r.status}: {r.error}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result_json(load, summary), indent=1))
        print(f"results: {args.out}")
    return 0 if not errors else 1
