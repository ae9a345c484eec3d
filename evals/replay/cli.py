"""`infersight replay`: stored production requests against a candidate, diffed token by token.

    infersight replay --store .infersight/store --window 2h --workload chat --to http://canary:8000
    infersight replay --store URL --window 2024-05-01T10:00..2024-05-01T11:00 --to URL --greedy \\
        --baseline-url http://prod:8000 --limit 500 --out replay.json

The result is an eval run in the store (and in --out); `infersight eval gate --replay RUN_ID` gates
a deploy on it. Exit codes: 0 replayed (whatever the agreement: the gate decides), 2 error (nothing
to replay, options that cannot compare, a deployment or store that cannot be reached).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="URL_OR_DIR",
                        help="the store with the production requests (the run is written there too)")
    parser.add_argument("--window", required=True, help="a duration back from now (2h, 30m, 7d) or START..END "
                                                        "(epoch, ISO 8601, relative; either side may be empty)")
    parser.add_argument("--to", required=True, metavar="URL", help="the candidate deployment (OpenAI-compatible)")
    parser.add_argument("--workload", default="", help="only requests with this workload tag (chat, agent, batch ...)")
    parser.add_argument("--model", default="", help="only requests served as this model name")
    parser.add_argument("--replica", default="", help="only requests this replica served")
    parser.add_argument("--greedy", action="store_true",
                        help="replay every selected prompt greedily, sampled ones too (those need --baseline-url)")
    parser.add_argument("--baseline-url", metavar="URL",
                        help="compare with this deployment's greedy answers instead of production's stored ones")
    parser.add_argument("--limit", type=int, metavar="N", help="the first N replayable requests of the window")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight per deployment (default 4)")
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument("--api-key", help="bearer token for --to and --baseline-url")
    parser.add_argument("--run-id", help="run id (default: replay-<UTC time>-<random>)")
    parser.add_argument("--out", metavar="FILE", help="also write the run as JSON")
    parser.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    from evals.replay.runner import ReplayOptions, replay
    from evals.replay.summary import summarize_replay
    from telemetry.store import StoreError, open_store

    options = ReplayOptions(window=args.window, to=args.to, workload=args.workload, model=args.model,
                            replica=args.replica, greedy=args.greedy, baseline_url=args.baseline_url,
                            limit=args.limit, concurrency=args.concurrency, timeout=args.request_timeout,
                            api_key=args.api_key, run_id=args.run_id)
    try:
        store = open_store(args.store)
    except (StoreError, OSError) as e:
        print(f"infersight replay: cannot open the store {args.store}: {e}", file=sys.stderr)
        return 2
    try:
        run_, notes = replay(store, options, progress=not args.no_progress, store_label=args.store)
    except (ValueError, ConnectionError, StoreError) as e:  # ReplayError is a ValueError
        print(f"infersight replay: error: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print("\n".join(summarize_replay(run_).lines()))
    for note in notes:
        print(f"  note: {note}")
    print(f"  stored in eval_runs / eval_items as {run_.run_id}")
    if args.out:
        print(f"  written to {run_.save(args.out)}")
    return 0
