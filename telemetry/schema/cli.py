"""`infersight migrate`: apply the schema to a store, or print it (one node or a cluster)."""

from __future__ import annotations

import argparse
import sys

from telemetry.schema import migrate, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default=".infersight/store",
                        help="data directory (embedded chdb) or http(s)://user:pass@host:port/db "
                             "(default: %(default)s)")
    parser.add_argument("--render", action="store_true", help="print the DDL instead of applying it")
    parser.add_argument("--cluster", default=None, help="cluster name: render/apply the ON CLUSTER variant "
                        "(Replicated* tables + Distributed tables)")
    parser.add_argument("--database", default="default", help="database for --render (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.render:
        try:
            sys.stdout.write(render(cluster=args.cluster, database=args.database))
        except ValueError as e:
            print(f"infersight migrate: {e}", file=sys.stderr)
            return 2
        return 0
    from telemetry.store import StoreError, open_store
    try:
        with open_store(args.store) as store:
            applied = migrate(store, cluster=args.cluster)
    except (StoreError, ValueError) as e:
        print(f"infersight migrate: {e}", file=sys.stderr)
        return 1
    print(f"{args.store}: applied {len(applied)} migration(s)" + (f" {applied}" if applied else ", up to date"))
    return 0
