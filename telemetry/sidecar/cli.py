"""`infersight sidecar`: the embedded ClickHouse store served over the ClickHouse HTTP protocol."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from telemetry.sidecar.handler import Users
from telemetry.sidecar.limits import Limits

_LIMITS = Limits()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=".infersight/store", help="chdb data directory (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8123, help="HTTP port; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--user", default=None, help="require this user (full access)")
    parser.add_argument("--password", default=os.environ.get("INFERSIGHT_SIDECAR_PASSWORD", ""),
                        help="its password (default: $INFERSIGHT_SIDECAR_PASSWORD)")
    parser.add_argument("--readonly-user", default=None, help="a read-only user for dashboards")
    parser.add_argument("--readonly-password", default=os.environ.get("INFERSIGHT_SIDECAR_READONLY_PASSWORD", ""),
                        help="its password (default: $INFERSIGHT_SIDECAR_READONLY_PASSWORD)")
    parser.add_argument("--name", default="sidecar", help="value of the `sidecar` label on /metrics")
    parser.add_argument("--max-body-mb", type=int, default=256, help="largest INSERT body accepted")
    parser.add_argument("--max-statement-kb", type=int, default=_LIMITS.max_statement_bytes >> 10,
                        help="largest body of any other statement (default: %(default)s)")
    parser.add_argument("--query-slots", type=int, default=_LIMITS.query_slots,
                        help="statements run at once; one more gets 503 + Retry-After (default: %(default)s)")
    parser.add_argument("--insert-threads", type=int, default=_LIMITS.insert_threads,
                        help="inserts run at once, apart from statements (default: %(default)s)")
    parser.add_argument("--insert-queue", type=int, default=_LIMITS.insert_queue,
                        help="inserts waiting for a thread; one more gets 503 (default: %(default)s)")
    parser.add_argument("--header-timeout", type=float, default=_LIMITS.header_timeout_seconds,
                        help="seconds a connection has to complete a request's headers (default: %(default)s)")
    parser.add_argument("--receive-timeout", type=float, default=_LIMITS.receive_timeout_seconds,
                        help="longest pause while a request body arrives, seconds (default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=_LIMITS.max_connections,
                        help="open connections; past it the longest idle one is closed (default: %(default)s)")
    parser.add_argument("--finding-active-window", type=float, default=3600,
                        help="seconds since last_seen during which a finding counts as active on /metrics")
    parser.add_argument("--query-timeout", type=float, default=120,
                        help="max_execution_time of each statement (the read-only user cannot raise it)")
    parser.add_argument("--max-result-mb", type=int, default=512, help="largest result a statement may return")
    parser.add_argument("--max-query-memory-mb", type=int, default=2048,
                        help="max_memory_usage of each statement (no user can raise it; default: %(default)s)")
    parser.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from telemetry.listen_check import refuse_busy_port
    from telemetry.sidecar.server import serve

    if refuse_busy_port("sidecar", args.host, args.port):  # before the store is opened and checked
        return 2
    from telemetry.store import StoreError

    users = Users(args.user, args.password, args.readonly_user, args.readonly_password)
    try:
        limits = Limits(max_statement_bytes=args.max_statement_kb << 10, query_slots=args.query_slots,
                        insert_threads=args.insert_threads, insert_queue=args.insert_queue,
                        header_timeout_seconds=args.header_timeout, receive_timeout_seconds=args.receive_timeout,
                        max_connections=args.max_connections)
    except ValueError as e:
        print(f"infersight sidecar: {e}", file=sys.stderr)
        return 2
    if (args.user or args.readonly_user) and not args.tls_cert and args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger(__name__).warning("basic auth over plain HTTP on %s: use --tls-cert/--tls-key", args.host)

    def ready(url: str) -> None:
        print(f"infersight sidecar: serving {url} (data dir {os.path.abspath(args.data_dir)})", flush=True)

    try:
        serve(args.data_dir, args.host, args.port, users, args.name, args.max_body_mb << 20,
              args.finding_active_window, limits, query_timeout_seconds=args.query_timeout,
              max_result_bytes=args.max_result_mb << 20, max_query_memory_bytes=args.max_query_memory_mb << 20,
              tls_cert=args.tls_cert, tls_key=args.tls_key,
              on_ready=ready)
    except (StoreError, OSError) as e:
        print(f"infersight sidecar: {e}", file=sys.stderr)
        return 1
    return 0
