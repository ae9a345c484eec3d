"""`infersight proxy --upstream URL --store S`: record what any OpenAI-compatible server answers.

    infersight proxy --upstream http://127.0.0.1:8000 --store http://127.0.0.1:8123 --port 8100 \\
        --replica-id v0 --model-dir evals/reference/models/target

Clients talk to the proxy as they would to the upstream. Every answered completion or chat
completion becomes a `requests` row under --replica-id (token IDs, hashes, workload tag from
`X-Workload`, trace id from `traceparent`, sampling parameters, per-token times). SIGTERM or Ctrl-C
drains the requests in flight, then the recorder flushes (what the store cannot take waits in the
spool directory for the next start).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from engine.core.config import ROLES
from engine.serving.proxy.extras import check_fraction
from engine.serving.server.engine_args import parse_size
from engine.serving.server.keep_alive import add_keep_alive_argument
from telemetry.connections import add_connection_arguments, connection_limits_from_args, raise_open_files_limit

log = logging.getLogger("infersight.proxy")


def logprobs_fraction(text: str) -> float:
    """--logprobs-fraction's value: a share in [0, 1]; anything else is argparse's usage error."""
    try:
        return check_fraction(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a share of requests between 0 and 1, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, metavar="URL",
                        help="the OpenAI-compatible server to forward to, e.g. http://127.0.0.1:8000")
    parser.add_argument("--store", default=None, metavar="TARGET",
                        help="telemetry store: the sidecar's URL or a data directory (default: record nothing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--replica-id", default="proxy-0",
                        help="the replica id the rows are stored under (the upstream's, where it records too)")
    parser.add_argument("--model-dir", default=None, metavar="DIR",
                        help="the upstream's model directory: its tokenizer makes token IDs where the upstream "
                             "returns none (marked in sampling_params_json), and its hashes go in the replica row")
    parser.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                        help="the sampling defaults the upstream applies to fields a request leaves unset, as vLLM's "
                             "--generation-config (give the upstream's value): auto, the --model-dir's "
                             "generation_config.json; vllm, none; a directory, its generation_config.json. Recorded "
                             "in each row's sampling_params_json as the values used (default: auto, vLLM's default)")
    parser.add_argument("--replica-row", action=argparse.BooleanOptionalAction, default=True,
                        help="write a replica row for the upstream (off where the engine writes its own: "
                             "infersight, or vLLM with infersight's stat-logger plugin)")
    parser.add_argument("--unasked-fields", choices=("auto", "null", "omit"), default="auto",
                        help="how the upstream writes a response field nobody asked for: null (vLLM) or omitted; "
                             "auto: null when its /v1/models says owned_by vllm")
    parser.add_argument("--logprobs-fraction", type=logprobs_fraction, default=1.0, metavar="F",
                        help="ask the upstream for each sampled token's logprob (where the client did not) on this "
                             "share of requests, 0 <= F <= 1, chosen by a hash of the request id: stored as "
                             "output_logprobs, which the sampled-traffic quality rule reads per request; the others "
                             "store none and spare the upstream computing them (default 1: every request)")
    parser.add_argument("--logprobs", dest="logprobs_fraction", action="store_const", const=1.0,
                        help="--logprobs-fraction 1")
    parser.add_argument("--no-logprobs", dest="logprobs_fraction", action="store_const", const=0.0,
                        help="--logprobs-fraction 0: never ask")
    parser.add_argument("--upstream-api-key", default=os.environ.get("INFERSIGHT_UPSTREAM_API_KEY"),
                        help="the key for the proxy's own calls to the upstream (/v1/models, /version); clients' "
                             "Authorization headers pass through (default: $INFERSIGHT_UPSTREAM_API_KEY)")
    parser.add_argument("--spool-dir", default=None, metavar="DIR",
                        help="where telemetry waits while the store is unreachable; replayed by the next start "
                             "(default: $XDG_STATE_HOME/infersight/spool/REPLICA_ID-proxy)")
    parser.add_argument("--spool-max-bytes", type=parse_size, default="256MiB", metavar="SIZE")
    parser.add_argument("--store-text", action=argparse.BooleanOptionalAction, default=False,
                        help="store prompt and output text (default: only their hashes and token IDs)")
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=False,
                        help="also export infersight_* request metrics at /infersight/metrics (the recorder's "
                             "counters are always there)")
    parser.add_argument("--vllm-metrics", action=argparse.BooleanOptionalAction, default=False,
                        help="with --metrics, also under vLLM's names (vllm:*): for an upstream that is not vLLM "
                             "(a vLLM upstream's own /metrics, passed through, has them already)")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--role", default="", choices=ROLES,
                        help="the upstream's role in a deploy, in its replica row: a recorded role decides which "
                             "side of a disagreement is the baseline (default: none)")
    parser.add_argument("--deploy-time", type=float, default=None, metavar="EPOCH",
                        help="when the upstream was deployed (epoch seconds; default: the proxy's launch)")
    add_keep_alive_argument(parser)
    add_connection_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_proxy(args):
    """(uvicorn.Server, telemetry parts, the RecordingProxy)."""
    import uvicorn

    from engine.serving.proxy.app import RecordingProxy
    from engine.serving.server.journal_barrier import journaled
    from telemetry.replica_wiring import build_observer
    from telemetry.spool import replica_spool_dir

    tokenizer, defaults = None, None
    if args.model_dir:
        from engine.core.tokenization import Tokenizer

        tokenizer = Tokenizer(args.model_dir)
    if args.model_dir or args.generation_config not in ("auto", "vllm"):  # auto reads the model directory
        from engine.core.generation_defaults import generation_defaults

        defaults = generation_defaults(args.model_dir or "", args.generation_config)
    spool = {"spool_dir": args.spool_dir or replica_spool_dir(f"{args.replica_id}-proxy"),
             "spool_max_bytes": args.spool_max_bytes, "journal": True}  # answered requests survive a kill -9
    model = os.path.basename(os.path.normpath(args.model_dir)) if args.model_dir else "unknown"
    observer, parts = build_observer(args.replica_id, model, store_target=args.store, store_text=args.store_text,
                                     metrics=args.metrics, recorder_kwargs=spool if args.store else None,
                                     vllm_names=args.vllm_metrics)
    proxy = RecordingProxy(args.upstream, observer, args.replica_id, tokenizer=tokenizer, unasked=args.unasked_fields,
                           replica_row=args.replica_row, upstream_api_key=args.upstream_api_key,
                           registry=parts.registry, logprobs_fraction=args.logprobs_fraction,
                           deploy={"role": args.role, "deploy_time": args.deploy_time}, generation_defaults=defaults)
    connections = connection_limits_from_args(args)  # slow or idle clients cannot hold the proxy's sockets
    raise_open_files_limit(2 * connections.max_connections + 256)  # each client's request has its upstream socket
    app = journaled(proxy.app(), parts.recorder)  # every recorded request on disk before its answer leaves
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.drain_timeout, timeout_keep_alive=args.timeout_keep_alive,
                            access_log=False, http=connections.protocol())
    return uvicorn.Server(config), parts, proxy


def run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from telemetry.listen_check import refuse_busy_port

    if refuse_busy_port("proxy", args.host, args.port):  # before its recorder and tokenizer are set up
        return 2
    try:
        server, parts, _ = build_proxy(args)
    except (ValueError, OSError) as e:
        print(f"infersight proxy: {e}", file=sys.stderr)
        return 2
    log.info("proxy for %s on http://%s:%d (replica %s, store %s)", args.upstream, args.host, args.port,
             args.replica_id, args.store or "none")
    # uvicorn drains on SIGTERM / Ctrl-C, then re-raises the signal to the handler it found: a no-op,
    # so a clean drain ends here, with the recorder's last flush and exit status 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        parts.close()
    return 0 if server.started else 1
