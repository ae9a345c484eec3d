"""`infersight fleet up|status|down`: a local fleet of replicas beside the sidecar.

    infersight fleet up --config engine/serving/fleet/examples/two_replicas.toml
    infersight fleet status --config engine/serving/fleet/examples/two_replicas.toml
    infersight fleet down --config engine/serving/fleet/examples/two_replicas.toml

`--run-dir` names the fleet's directory directly (state file, logs, store);
by default it comes from the config (`.infersight/fleets/<name>`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from engine.serving.fleet.config import default_run_dir, load_fleet, override_ports
from engine.serving.fleet.fleet import fleet_down, fleet_status, fleet_up
from engine.serving.processes import infersight_command, spawn
from engine.serving.fleet.state import FleetState, ProcessState
from engine.serving.fleet.supervisor import supervise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)

    def where(p):
        p.add_argument("--config", help="fleet TOML file")
        p.add_argument("--run-dir", help="the fleet's run directory (default: from the config)")

    up = sub.add_parser("up", help="start the sidecar and the replicas, wait until healthy")
    where(up)
    up.add_argument("--host", default=None, help="address every process listens on (default: the TOML's host)")
    up.add_argument("--base-port", type=int, default=None, metavar="PORT",
                    help="replica i listens on PORT+i where the TOML leaves its port 0 (default: free ports)")
    up.add_argument("--sidecar-port", type=int, default=None, metavar="PORT",
                    help="the sidecar's port (default: the TOML's [sidecar] port; 0: a free one)")
    up.add_argument("--foreground", action="store_true",
                    help="stay in the foreground: report (and restart) dying replicas; Ctrl-C brings the fleet down")
    status = sub.add_parser("status", help="health of every process of the fleet")
    where(status)
    status.add_argument("--json", action="store_true")
    down = sub.add_parser("down", help="stop everything (SIGTERM, then SIGKILL after --timeout)")
    where(down)
    down.add_argument("--timeout", type=float, default=None)
    sv = sub.add_parser("supervise")  # internal (the fleet's own watcher): no help, so --help does not list it
    where(sv)
    sv.add_argument("--interval", type=float, default=2.0)


def _run_dir(args) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    if args.config:
        return Path(load_fleet(args.config).run_dir)
    fleets = [p.parent for p in (default_run_dir("x").parent).glob("*/state.json")]
    if len(fleets) == 1:
        return fleets[0]
    here = f" (fleets here: {', '.join(map(str, fleets))})" if fleets else ""
    raise ValueError("give --config or --run-dir" + here)


def print_endpoints(state: FleetState, out=sys.stdout) -> None:
    print(f"fleet {state.name!r} is up (run dir {state.run_dir})", file=out)
    if state.sidecar:
        print(f"  sidecar   {state.sidecar.url}  pid {state.sidecar.pid}  (the telemetry store)", file=out)
    elif state.store_url:
        print(f"  store     {state.store_url}", file=out)
    for r in state.replicas:
        pin = f"  cpus {r.cpus}" if r.cpus else (f"  numa node {r.numa_node}" if r.numa_node is not None else "")
        behind = next((u for u in state.upstreams if u.name.split("/")[0] == r.name), None)
        via = f"  (recording proxy for {behind.engine} at {behind.url}, pid {behind.pid})" if behind else ""
        print(f"  {r.name:<9} {r.url}  pid {r.pid}{pin}  restart={str(r.restart).lower()}{via}", file=out)
    endpoints = ",".join(r.url for r in state.replicas)
    print(f"\n  infersight loadgen --endpoints {endpoints} --workload mixed --duration 30", file=out)
    if state.store_url:
        print(f"  infersight dashboard --store {state.store_url}", file=out)
    print(f"  infersight fleet status --run-dir {state.run_dir}", file=out)
    print(f"  infersight fleet down --run-dir {state.run_dir}", file=out)


def _up(args) -> int:
    if not args.config:
        raise ValueError("fleet up needs --config FILE (examples: engine/serving/fleet/examples/*.toml)")
    config = override_ports(load_fleet(args.config), args.host, args.base_port, args.sidecar_port)
    if args.run_dir:
        config.run_dir = Path(args.run_dir)
    state = fleet_up(config, progress=lambda m: print(f"[fleet] {m}", flush=True))
    if args.foreground:
        print_endpoints(state)
        print("\nsupervising (Ctrl-C brings the fleet down)", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            supervise(state.run_dir, stop=stop, report=lambda m: print(f"[fleet] {m}", flush=True))
        except KeyboardInterrupt:
            pass
        finally:
            _print_down(fleet_down(state.run_dir))
        return 0
    if any(r.restart for r in state.replicas):  # someone must watch them once we return
        run_dir = str(state.run_dir)
        cmd = infersight_command("fleet", "supervise", "--run-dir", run_dir)
        log = Path(run_dir) / "logs" / "supervisor.log"
        ref = spawn(cmd, log)
        state.supervisor = ProcessState("supervisor", ref.pid, ref.start_ticks, "", 0, cmd, str(log))
        state.save()
    print_endpoints(state)
    return 0


def _status(args) -> int:
    state = FleetState.load(_run_dir(args))
    rows = fleet_status(state)
    if args.json:
        print(json.dumps({"name": state.name, "run_dir": state.run_dir, "processes": rows,
                          "events": state.events}, indent=2))
    else:
        print(f"fleet {state.name!r} ({state.run_dir})")
        for row in rows:
            health = "healthy" if row["healthy"] else ("running, not healthy" if row["running"] else "DEAD")
            d = row["detail"]
            extra = (f"  running={d.get('running', '?')} waiting={d.get('waiting', '?')} "
                     f"kv_used={d.get('kv_blocks_used', '?')}/{d.get('kv_blocks_total', '?')}") if d else ""
            restarts = f"  restarts={row['restarts']}" if row["restarts"] else ""
            print(f"  {row['kind']:<10} {row['name']:<10} pid {row['pid']:<7} {row['url'] or '-':<24} "
                  f"{health}{restarts}{extra}")
            if not row["running"]:
                print(f"             log: {row['log']}")
        for event in state.events[-5:]:
            print(f"  event: {event}")
    replicas = [r for r in rows if r["kind"] == "replica"]
    return 0 if rows and all(r["healthy"] for r in rows if r["kind"] != "supervisor") and replicas else 1


def _print_down(outcome: dict) -> None:
    for name, how in outcome.items():
        print(f"  {name}: {how}")


def run(args) -> int:
    try:
        if args.fleet_command == "up":
            return _up(args)
        if args.fleet_command == "status":
            return _status(args)
        if args.fleet_command == "down":
            run_dir = _run_dir(args)
            print(f"bringing fleet down ({run_dir})")
            _print_down(fleet_down(run_dir, args.timeout))
            return 0
        if args.fleet_command == "supervise":
            supervise(_run_dir(args), args.interval, report=lambda m: print(m, flush=True))
            return 0
    except (ValueError, RuntimeError) as e:
        print(f"infersight fleet {args.fleet_command}: {e}", file=sys.stderr)
        return 1
    return 2
