"""`infersight serve --model DIR`: one replica behind an OpenAI-compatible HTTP API.

Order matters: pin the process (--cpus / --numa-node) before torch starts its
threads, refuse what cannot work (preflight.py: a context the KV cache cannot hold, a
tokenizer that does not fit the embedding), build the telemetry observer, load the
engine, log the start summary (server_log.py), then serve: an `infersight.access` line
per request and an `infersight.stats` line every --stats-interval seconds. SIGTERM or
Ctrl-C stops accepting connections and drains in-flight requests for up to
--drain-timeout seconds before the engine and the recorder shut down.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path

from engine.serving.server.engine_args import add_engine_arguments, engine_config_from_args, parse_size, serve_options
from engine.serving.server.keep_alive import add_keep_alive_argument
from engine.serving.server.tool_parsers import PARSERS
from telemetry.connections import add_connection_arguments, connection_limits_from_args, raise_open_files_limit

log = logging.getLogger("infersight.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--store", default=None, metavar="TARGET",
                        help="telemetry store: the sidecar's URL (http://host:port) or a data directory; "
                             "default: no recorder (metrics and tracing only)")
    parser.add_argument("--spool-dir", default=None, metavar="DIR",
                        help="where telemetry waits on disk while the store is unreachable; the next start with "
                             "the same directory replays it (default: $XDG_STATE_HOME/infersight/spool/REPLICA_ID, "
                             "~/.local/state/... without XDG_STATE_HOME)")
    parser.add_argument("--spool-max-bytes", type=parse_size, default="256MiB", metavar="SIZE",
                        help="bound of the telemetry spool; past it, new batches are dropped and counted "
                             "(infersight_telemetry_rows_dropped_total)")
    parser.add_argument("--store-text", action=argparse.BooleanOptionalAction, default=False,
                        help="store the prompt and output text of requests in telemetry (default: only their "
                             "hashes and token IDs; the recorder writes empty text)")
    parser.add_argument("--api-key", default=os.environ.get("INFERSIGHT_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: $INFERSIGHT_API_KEY)")
    parser.add_argument("--tracing", choices=("none", "console", "otlp"), default="none")
    parser.add_argument("--otlp-endpoint", default=None, help="OTLP/HTTP collector, e.g. http://localhost:4318")
    parser.add_argument("--vllm-metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="/metrics also shows vLLM's names and labels (vllm:*), so that dashboards and alerts "
                             "built for vLLM work on this replica (default: on)")
    parser.add_argument("--cpus", default=None, help="pin the replica to these CPUs, e.g. '0-3,8'")
    parser.add_argument("--numa-node", type=int, default=None, help="pin CPUs and memory to this NUMA node")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the number of CPUs the replica may use)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds to let in-flight requests finish on shutdown")
    add_keep_alive_argument(parser)
    add_connection_arguments(parser)
    parser.add_argument("--max-queue", type=int, default=None, metavar="N",
                        help="requests that may wait beyond the --max-num-seqs running; more get 429 with "
                             "Retry-After (default: 4 x max_num_seqs)")
    parser.add_argument("--tool-call-parser", default=None, choices=sorted(PARSERS), metavar="NAME",
                        help="how the model writes tool calls, vLLM's names: " + ", ".join(sorted(PARSERS))
                             + " (default: detected from the chat template; the start summary names it)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--stats-interval", type=float, default=10.0, metavar="SECONDS",
                        help="log running / waiting / KV use and prompt and generation throughput every SECONDS "
                             "(logger infersight.stats; 0: off)")
    parser.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                        help="one line per request: id, status, tokens, TTFT, e2e (logger infersight.access)")
    add_engine_arguments(parser)


def _pin(args):
    """The Placement after pinning, or None when no pinning was asked for."""
    if args.cpus is None and args.numa_node is None:
        return None
    from engine.core.placement import bind_replica

    placement = bind_replica(cpus=args.cpus, numa_node=args.numa_node)
    log.info("pinned to CPUs %s (NUMA nodes %s)%s", placement.cpu_affinity, placement.cpu_numa_nodes,
             "; " + "; ".join(placement.notes) if placement.notes else "")
    return placement


def build_server(args, placement=None):
    """(uvicorn.Server, telemetry parts): everything `run` needs, loaded and ready to serve."""
    import torch
    import uvicorn

    from engine.core.async_engine import AsyncLLM
    from engine.serving.server.app import build_app
    from engine.serving.server.journal_barrier import journaled
    from engine.serving.server.load_shedding import default_max_queue
    from engine.serving.server.model_info import ServedModel
    from engine.serving.server.preflight import preflight
    from engine.serving.server.server_log import StatsLogger, StepThroughput, start_summary
    from engine.serving.server.tool_calls import PARSER_KEY, describe
    from telemetry.contract.hooks import MultiObserver
    from telemetry.replica_wiring import build_observer
    from telemetry.spool import replica_spool_dir

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    config = preflight(engine_config_from_args(args.model, args))
    # the server's flags in the identity, the queue bound as it takes effect (load_shedding.py): a replica
    # that sheds more is explained by it
    effective_queue = default_max_queue(config.max_num_seqs) if args.max_queue is None else args.max_queue
    config = dataclasses.replace(config, serve_options={**serve_options(args), "max_queue": effective_queue})
    model_name = config.served_model_name or Path(config.model).resolve().name
    spool = {"spool_dir": args.spool_dir or replica_spool_dir(config.replica_id),  # a restart replays it
             "spool_max_bytes": args.spool_max_bytes, "journal": True}  # answered requests survive a kill -9
    observer, parts = build_observer(config.replica_id, model_name, store_target=args.store,
                                     store_text=args.store_text, tracing=args.tracing,
                                     otlp_endpoint=args.otlp_endpoint, recorder_kwargs=spool,
                                     vllm_names=args.vllm_metrics)
    throughput = StepThroughput() if args.stats_interval > 0 else None
    if throughput is not None:  # the stats line counts tokens per step, as the engine computes them
        observer = MultiObserver([observer, throughput])
    engine = AsyncLLM(config, observer)
    served = ServedModel.from_engine(engine, created=int(time.time()))
    served.extra[PARSER_KEY] = getattr(args, "tool_call_parser", None)
    for line in start_summary(engine.engine, placement, args.store, tools=describe(served)):
        log.info("%s", line)
    stats = StatsLogger(served, throughput, args.stats_interval) if throughput is not None else None
    if not args.access_log:
        logging.getLogger("infersight.access").setLevel(logging.WARNING)
    app = build_app(served, api_key=args.api_key, metrics_registry=parts.registry, max_queue=args.max_queue,
                    metrics_observer=parts.metrics, stats=stats)
    app = journaled(app, parts.recorder)  # every finished request's record on disk before its answer leaves
    connections = connection_limits_from_args(args)  # slow or idle clients cannot hold the server's sockets
    raise_open_files_limit(connections.max_connections + 256)  # + the model's files, the store's sockets
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                               timeout_graceful_shutdown=args.drain_timeout, timeout_keep_alive=args.timeout_keep_alive,
                               access_log=False, http=connections.protocol())
    # everything loaded so far (torch, transformers, the model) lives until exit: move it out of the
    # collector's sight, so no collection walks it while serving, nor for seconds at exit
    gc.collect()
    gc.freeze()
    return uvicorn.Server(uv_config), parts


def run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from engine.core.models.errors import ModelLoadError
    from telemetry.listen_check import refuse_busy_port
    from engine.serving.server.quiet_exit import exit_now

    if refuse_busy_port("serve", args.host, args.port):  # before the weights load, not after
        return 2
    try:
        server, parts = build_server(args, _pin(args))
    except (ValueError, FileNotFoundError, OSError, ModelLoadError) as e:
        print(f"infersight serve: {e}", file=sys.stderr)
        return 2
    # uvicorn drains on SIGTERM / Ctrl-C, then re-raises the signal to the handler it found: make that
    # one a no-op, so a clean drain ends here, with the last telemetry flush and exit status 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        parts.close()  # idempotent: the engine's shutdown already flushed its observers
    exit_now(0 if server.started else 1)  # without triton's nanobind leak report at finalization
    return 1  # not reached
