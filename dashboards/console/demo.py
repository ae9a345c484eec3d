"""`infersight demo`: the whole loop on this machine in under three minutes.

1. a model: the shipped reference model, or a tiny random-weight Llama until it exists;
2. a fleet: the sidecar (embedded ClickHouse over HTTP) and 2-3 healthy replicas, each pinned to
   one CPU, each writing its telemetry to the sidecar; continuous cross-scoring on, as in every fleet
   (the canary's fleet below writes to this store, so it is scored too);
3. act one: the mixed workload (chat + agent + batch, answers that stop at EOS, some greedy) for
   half of --duration seconds; a few answers decoded from the stored token IDs;
4. act two: one fault deployed through configuration (`--fault`: a canary on a changed tokenizer,
   or on int4 weights; demo_fault.py), a probe round and the second half of the traffic;
5. a report from the store: requests and tokens per replica, TTFT / ITL percentiles, KV usage,
   prefix hits; then the diagnostics' findings, worst first, with the evidence that caught the
   canary;
6. the command that opens the dashboard on what was recorded.
Every process it starts is stopped at the end, on Ctrl-C and on error too (unless --keep-running).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from dashboards.console.demo_fault import CANARY, FAULTS, answers, canary_fleet
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec, override_ports
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.core.model_refs import REFERENCE_MODEL, reference_model_available, resolve_model

# small engines (two replicas and the sidecar share two cores with the load generator); 4096 KV slots
# each, whatever the model, so KV usage means the same on the tiny model and the reference model. Eager
# decode steps: a compiled replica builds its graphs in the background for tens of seconds to minutes of its
# one CPU, most of a one-minute demo
DEMO_ENGINE = {"max_num_seqs": 16, "num_kv_blocks": 256, "block_size": 16, "max_num_batched_tokens": 1024,
               "compile_decode": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of traffic, half before the fault and half after (default 60)")
    parser.add_argument("--replicas", type=int, default=2, choices=(1, 2, 3), help="healthy replicas")
    parser.add_argument("--fault", choices=sorted(FAULTS), default="tokenizer",
                        help="what the canary is started on: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()))
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s over the whole fleet (Poisson)")
    parser.add_argument("--model", default="reference",
                        help="model directory, 'reference' (default) or 'tiny-random:llama'")
    parser.add_argument("--run-dir", type=Path, default=Path(".infersight/demo"))
    parser.add_argument("--keep-running", action="store_true", help="leave the fleet up afterwards")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="address the sidecar and replicas listen on")
    parser.add_argument("--port", type=int, default=0,
                        help="the sidecar's (telemetry store's) port (default 0: a free one, printed at start)")
    parser.add_argument("--base-port", type=int, default=0, metavar="PORT",
                        help="replica i listens on PORT+i (default 0: free ports, printed at start)")


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def demo_fleet(args, model: Path) -> FleetConfig:
    cpus = sorted(os.sched_getaffinity(0))
    replicas = [ReplicaSpec(id=f"r{i}", model=str(model), cpus=str(cpus[i % len(cpus)]), threads=1,
                            engine=dict(DEMO_ENGINE), drain_timeout=5.0) for i in range(args.replicas)]
    config = FleetConfig(name="demo", host=args.host, run_dir=args.run_dir, startup_timeout=120.0,
                         stop_timeout=10.0, sidecar=SidecarSpec(port=args.port), replicas=replicas)
    return override_ports(config, base_port=args.base_port)


def canary_port(args) -> int:
    """The canary listens after the healthy replicas: --base-port + --replicas (0: a free port)."""
    return args.base_port + args.replicas if args.base_port else 0


def infersight_program() -> list[str]:
    """How this demo was started, to print commands that run as printed: the `infersight` script's
    path (`.venv/bin/infersight`), else this interpreter with the CLI module."""
    if Path(sys.argv[0]).name == "infersight":
        return [sys.argv[0]]
    return [sys.executable, "-m", "dashboards.console.cli"]


def printed_command(*args: str) -> str:
    return shlex.join([*infersight_program(), *args])


def run_traffic(urls: list[str], args, run_id: str, seconds: float, seed: int):
    from engine.traffic.loadgen.arrivals import Arrival
    from engine.traffic.loadgen.cli import make_progress
    from engine.traffic.loadgen.runner import run_load
    from engine.traffic.loadgen.stats import format_table, summarize
    from engine.traffic.loadgen.workloads import make_workload

    # the demo's models are small: keep prompts and outputs modest so a minute shows many requests;
    # answers end at EOS as real ones do, and a third are greedy (what the drift checks compare)
    workload = make_workload("mixed", seed=seed, scale=0.5, ignore_eos=False, greedy_share=0.3)
    update, close = make_progress(None, True, desc=f"mixed traffic over {len(urls)} replicas, {seconds:g} s")
    try:
        load = asyncio.run(run_load(urls, workload, Arrival("poisson", rate=args.rate), duration=seconds,
                                    seed=seed, run_id=run_id, progress=update, request_timeout=60.0))
    finally:
        close()
    summary = summarize(load.results, load.wall_seconds)
    scale = load.config["prompt_scale"]
    if scale != workload.scale:
        say(f"prompts were scaled by {scale:.2g} to fit the replicas' context")
    print(format_table(summary, "by_workload"))
    return load


def report(store_url: str, sent: int, run_id: str, replicas: list[str], since: float, model: Path) -> None:
    """The store's view of the run, then the diagnostics' findings."""
    from dashboards.console.demo_report import collect, format_report
    from telemetry.store import open_store
    from telemetry.store.waiting import wait_for_requests

    store = open_store(store_url)
    try:
        stored = wait_for_requests(store, run_id + "-", sent)
        say(f"the store holds {stored} of the {sent} requests sent")
        print(format_report(collect(store, run_id, replicas, since)))
        findings(store, replicas, since)
    finally:
        store.close()


def show_answers(store_url: str, round_id: str, model: Path, replicas: list[str], expected: int) -> None:
    from telemetry.store import open_store
    from telemetry.store.waiting import wait_for_requests

    with open_store(store_url) as store:
        wait_for_requests(store, f"probe.{round_id}.", expected)
        print(answers(store, round_id, model, replicas))


def findings(store, replicas: list[str], since: float) -> None:
    """Every diagnostic over this run (its replicas, since it started); findings are stored too, so the
    sidecar exports them on /metrics. Said so, and skipped, in a build without the diagnostics."""
    try:
        import diagnostics
        from diagnostics.findings import format_table
        from diagnostics.request import DiagnosticRequest
        from diagnostics.scope import Scope
    except ImportError:
        say("findings: the diagnostics are not part of this build (`infersight diagnose` runs them)")
        return
    say("running the diagnostics over this run")
    errors: list = []
    try:
        found = diagnostics.run_all(store, DiagnosticRequest(Scope(start=since, replicas=tuple(replicas))),
                                      errors=errors)
    except Exception as e:  # noqa: BLE001 - the report must not fail on a diagnostic's bug
        say(f"findings: the diagnostics failed ({type(e).__name__}: {e})")
        return
    loud = [f for f in found if f.severity != "info"]
    quiet = len(found) - len(loud)
    print(f"findings above info ({len(loud)}; {quiet} info findings, such as 'insufficient data', are in "
          "`infersight diagnose` and the dashboard)")
    print(format_table(loud) if loud else "  none: the fleet looks healthy")
    for name, e in errors:
        say(f"findings: diagnostic {name} failed ({type(e).__name__}: {e})")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM ends the demo as Ctrl-C does: through the cleanup in `run`


def run(args) -> int:
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    if args.model == "reference" and not reference_model_available():
        say(f"no reference model at {REFERENCE_MODEL} yet: using a tiny random-weight Llama")
    say("preparing the model")
    model = resolve_model(args.model)
    say(f"model: {model}")
    state = canary = None
    code = 0
    try:
        config = demo_fleet(args, model)
        state = fleet_up(config, progress=say)
        say(f"sidecar {state.store_url}; replicas " + ", ".join(f"{r.name}={r.url} (cpu {r.cpus})"
                                                                  for r in state.replicas))
        run_id = f"demo{int(time.time())}"
        since = time.time()
        urls = [r.url for r in state.replicas]
        say("act one: the healthy fleet")
        sent = len(run_traffic(urls, args, f"{run_id}-a", args.duration / 2, args.seed).results)
        say(f"act two: a canary on {FAULTS[args.fault]}")
        cpus = sorted(os.sched_getaffinity(0))
        canary = fleet_up(canary_fleet(args.fault, model, Path(state.run_dir), state.store_url, DEMO_ENGINE,
                                       str(cpus[-1]), args.host, port=canary_port(args)), progress=say)
        urls += [r.url for r in canary.replicas]
        from engine.traffic.probe.runner import run_probe_round

        probed = run_probe_round(urls)
        say(f"probe round {probed.round_id}: the shipped greedy suite to every replica")
        show_answers(state.store_url, probed.round_id, model, [r.name for r in state.replicas] + [CANARY],
                     sum(r.ok + r.fillers_sent for r in probed.replicas))
        sent += len(run_traffic(urls, args, f"{run_id}-b", args.duration / 2, args.seed + 1).results)
        report(state.store_url, sent, run_id, [r.name for r in state.replicas] + [CANARY], since, model)
        # absolute paths: the commands work from any directory; the dashboard finds each replica's
        # tokenizer from the model directory its `replicas` row names (no --model needed)
        data_dir = (Path(state.run_dir) / "store").resolve()
        print()
        if args.keep_running:
            say("the fleet keeps running; open the dashboard with")
            print(f"  {printed_command('dashboard', '--store', state.store_url)}")
            print(f"  {printed_command('fleet', 'down', '--run-dir', str(Path(state.run_dir).resolve()))}")
            if canary is not None:
                print(f"  {printed_command('fleet', 'down', '--run-dir', str(Path(canary.run_dir).resolve()))}")
        else:
            say("open the dashboard on what was recorded with")
            print(f"  {printed_command('dashboard', '--store', str(data_dir))}")
    except KeyboardInterrupt:
        say("interrupted")
        code = 130
    except Exception as e:  # noqa: BLE001 - say what failed; the fleet still comes down below
        say(f"failed: {type(e).__name__}: {e}")
        code = 1
    finally:
        if state is not None and not (args.keep_running and code == 0):
            say("stopping the fleet")
            for fleet in (canary, state):
                try:
                    if fleet is not None:
                        fleet_down(fleet.run_dir)
                except ValueError:
                    pass
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    say(f"done in {time.monotonic() - started:.0f} s")
    gc.freeze()  # exit now, without seconds of collecting what the diagnostics imported
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
