"""`infersight profile --replica R --seconds N --store TARGET`: py-spy a replica, store its folded
stacks in `profiles`, print the top functions by self time per group."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replica", required=True, help="replica id, or the replica's URL (asked via /health)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample (default 10)")
    parser.add_argument("--store", help="the telemetry store (directory or http(s)://user:pass@host:port/db): "
                                        "where the replica's pid is looked up and the profile is written")
    parser.add_argument("--run-dir", help="a fleet's run directory: take the pid from its state file")
    parser.add_argument("--pid", type=int, help="the process id, when known")
    parser.add_argument("--rate", type=int, default=100, help="samples per second (default 100)")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--top", type=int, default=5, help="functions shown per group")
    parser.add_argument("--no-write", action="store_true", help="print only, store nothing")


def run(args) -> int:
    from diagnostics import profile, pyspy

    if args.seconds <= 0:
        print("infersight profile: --seconds must be positive", file=sys.stderr)
        return 2
    store = None
    try:
        if args.store:
            from telemetry.schema import migrate
            from telemetry.store import open_store

            store = open_store(args.store)
            migrate(store)
        target = profile.resolve_target(args.replica, store, args.run_dir, args.pid)
        print(f"profiling {target.replica_id} (pid {target.pid}, from {target.source}) for {args.seconds:g} s ...",
              flush=True)
        start = profile.now()
        stacks = pyspy.record(target.pid, args.seconds, args.rate, args.native)
        records, idle = profile.profile_records(stacks, target.replica_id, target.pid, start, args.seconds)
        if not records:
            print(f"no samples: {target.replica_id} was idle ({idle} samples of threads only waiting)")
            return 0
        print(profile.format_report(target.replica_id, target.pid, args.seconds, records, args.top, idle))
        if store is not None and not args.no_write:
            store.insert_records("profiles", records)
            print(f"stored profile {records[0].profile_id} ({len(records)} stacks) in the store's profiles table")
        return 0
    except (profile.TargetError, pyspy.ProfileError, ValueError) as e:
        print(f"infersight profile: {e}", file=sys.stderr)
        return 1
    finally:
        if store is not None:
            store.close()
