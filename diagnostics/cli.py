"""`infersight diagnose [regression|replicas|tokenizer|drift|speculative|overhead|all] --store TARGET`

Runs diagnostics over a scope, prints the findings as a table, and records them in the store's
`findings` table (the sidecar exports active ones as Prometheus gauges). Exit status: 0, or 1
when a finding reaches --fail-on; 2 on bad arguments or a store that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys

from diagnostics import DIAGNOSTICS

CHOICES = (*DIAGNOSTICS, "all")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("diagnostic", nargs="?", default="all", choices=CHOICES, help="which diagnostic (default all)")
    parser.add_argument("--store", required=True, help="data directory or http(s)://user:pass@host:port/db")
    scope = parser.add_argument_group("scope")
    scope.add_argument("--since", default=None, help="window start: epoch, ISO 8601, or relative (2h, 7d); "
                                                     "default 24h unless --until is given")
    scope.add_argument("--until", default=None, help="window end (default now)")
    scope.add_argument("--replicas", default="", help="comma-separated replica ids")
    scope.add_argument("--versions", default="", help="comma-separated engine versions")
    scope.add_argument("--config-hashes", default="", help="comma-separated config hashes")
    scope.add_argument("--models", default="", help="comma-separated model names")
    sides = parser.add_argument_group("comparison (regression, drift, speculative)")
    sides.add_argument("--baseline", help="e.g. version=0.1.0 | replica=r1,r2 | config_hash=ab12 | window=2h..1h")
    sides.add_argument("--candidate", help="same forms as --baseline")
    parser.add_argument("--model-dir", action="append", default=[], metavar="NAME=DIR",
                        help="tokenizer/model directory of a replica id or model name (repeatable)")
    parser.add_argument("--no-write", action="store_true", help="print the findings, do not record them")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON lines (with evidence)")
    parser.add_argument("--wide", action="store_true",
                        help="one line per finding, however long (default on a terminal: summaries wrap to its "
                             "width; piped: one line each)")
    parser.add_argument("--fail-on", choices=("never", "warning", "critical"), default="never",
                        help="exit 1 when a finding is at least this severe (default never)")
    parser.add_argument("--log-level", default="warning")


def table_width(wide: bool, stream=None) -> int | None:
    """Columns to wrap summaries to: the terminal's, or None (no wrapping) with --wide or when not a TTY."""
    import shutil

    stream = sys.stdout if stream is None else stream
    if wide or not stream.isatty():
        return None
    return shutil.get_terminal_size().columns


def build_scopes(args, now: float | None = None):
    from diagnostics import DEFAULT_WINDOW
    from diagnostics.scope import Scope

    since = args.since if (args.since or args.until) else DEFAULT_WINDOW
    scope = Scope.window(since=since, until=args.until, now=now, replicas=args.replicas, versions=args.versions,
                         config_hashes=args.config_hashes, models=args.models)
    if bool(args.baseline) != bool(args.candidate):
        raise ValueError("give both --baseline and --candidate, or neither")
    baseline = scope.with_side(args.baseline, now) if args.baseline else None
    candidate = scope.with_side(args.candidate, now) if args.candidate else None
    return scope, baseline, candidate


def run(args) -> int:
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from diagnostics import DIAGNOSTICS
    from diagnostics import run as run_diagnostics
    from diagnostics.findings import SEVERITY_RANK, format_table, jsonable
    from diagnostics.replica_tokenizers import parse_model_dirs
    from diagnostics.request import DiagnosticRequest
    from telemetry.store import StoreError, open_store

    try:
        scope, baseline, candidate = build_scopes(args)
        model_dirs = parse_model_dirs(args.model_dir)
    except ValueError as e:
        print(f"infersight diagnose: {e}", file=sys.stderr)
        return 2
    names = DIAGNOSTICS if args.diagnostic == "all" else (args.diagnostic,)
    errors: list = []
    try:
        store = open_store(args.store)
    except (StoreError, OSError) as e:
        print(f"infersight diagnose: cannot open the store {args.store}: {e}", file=sys.stderr)
        return 2
    availability_table = ""
    try:
        request = DiagnosticRequest(scope, baseline, candidate, model_dirs)
        findings = run_diagnostics(names, store, request, write=not args.no_write, errors=errors)
        if "availability" in names and not args.json:  # each replica's error budget beside its latency
            from diagnostics.availability import replica_table

            availability_table = replica_table(store, scope)
    finally:
        store.close()
    if args.json:
        for f in findings:
            print(json.dumps(jsonable({"finding_id": f.finding_id, "kind": f.kind, "severity": f.severity,
                                       "subject": f.subject, "diagnostic": f.diagnostic, "summary": f.summary,
                                       "evidence": f.evidence})))
    else:
        if availability_table:
            print("availability and latency per replica (shares of the requests each received)\n"
                  + availability_table + "\n")
        print(format_table(findings, table_width(args.wide)))
        if not args.no_write:
            print(f"\n{len(findings)} finding(s) recorded in the store's findings table")
    for name, e in errors:
        print(f"infersight diagnose: {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
    if errors and len(errors) == len(names):
        return 2
    if args.fail_on != "never" and any(SEVERITY_RANK[f.severity] >= SEVERITY_RANK[args.fail_on] for f in findings):
        return 1
    return 0
