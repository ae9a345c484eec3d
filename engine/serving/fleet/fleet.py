"""Bring a fleet up, look at it, bring it down.

up:     resolve models, give out ports, start the sidecar (the telemetry store)
        and wait for it, start every replica (`infersight serve`, its own
        process, pinned as configured, spooling telemetry under
        <run_dir>/spool/<replica id>) and wait until each answers /health,
        then write the state file, then start the scheduled prober where the
        config has a [probe] table. A failure stops whatever was started.
        A vLLM replica (`engine = "vllm"`) is `vllm serve` behind its recording
        proxy (engine/serving/fleet/vllm_replica.py): the proxy is the replica's endpoint.
status: for every process in the state file: running? healthy? (and what the
        replica says about itself).
down:   supervisor and prober first (so nothing restarts or probes), then replicas (they flush
        telemetry to the sidecar while draining), then the sidecar.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from engine.serving.fleet.config import FleetConfig, ProbeSpec, ReplicaSpec
from engine.serving.fleet.cross_score_spec import CrossScoreSpec
from engine.core.model_refs import resolve_model
from engine.serving.processes import alive, infersight_command, spawn, stop, wait_compiled, wait_healthy
from engine.util import free_port, port_in_use
from engine.serving.fleet.state import FleetState, ProcessState
from engine.serving.fleet.vllm_replica import check_plugin, start_vllm_replica, vllm_python
from engine.serving.server.engine_args import engine_cli_args
from telemetry.batch_token import safe_replica_id

SIDECAR_HEALTH = "/ping"


def _noop(message: str) -> None:
    pass


def replica_spool_dir(run_dir: Path, replica_id: str) -> Path:
    """Where a replica spools telemetry: under the fleet's run directory, the same at every
    (re)start of the replica, so what one process spooled the next one replays."""
    return Path(run_dir) / "spool" / safe_replica_id(replica_id)


def deploy_args(spec: ReplicaSpec, deploy_time: float | None) -> list[str]:
    """`--role` and `--deploy-time` of a replica: every replica one `fleet up` starts gets the same deploy
    time, so the baseline rule sees them started together, whichever loaded first; a supervisor restart
    reuses the command, and so the deploy it belongs to."""
    return (["--role", spec.role] if spec.role else []) + (
        ["--deploy-time", f"{deploy_time:.6f}"] if deploy_time is not None else [])


def replica_command(spec: ReplicaSpec, model_dir: Path, host: str, port: int, store_url: str | None,
                    log_level: str = "warning", spool_dir: Path | None = None,
                    deploy_time: float | None = None) -> list[str]:
    cmd = infersight_command("serve", "--model", str(model_dir), "--host", host, "--port", str(port),
                             "--replica-id", spec.id, "--tracing", spec.tracing, "--log-level", log_level,
                             "--drain-timeout", str(spec.drain_timeout), *deploy_args(spec, deploy_time))
    if store_url:
        cmd += ["--store", store_url]
    if spool_dir is not None:
        cmd += ["--spool-dir", str(spool_dir)]
    if spec.cpus is not None:
        cmd += ["--cpus", spec.cpus]
    if spec.numa_node is not None:
        cmd += ["--numa-node", str(spec.numa_node)]
    if spec.threads is not None:
        cmd += ["--threads", str(spec.threads)]
    if spec.api_key:
        cmd += ["--api-key", spec.api_key]
    if spec.otlp_endpoint:
        cmd += ["--otlp-endpoint", spec.otlp_endpoint]
    return cmd + engine_cli_args(spec.engine) + list(spec.args)


def sidecar_command(data_dir: Path, host: str, port: int, extra: list[str]) -> list[str]:
    return infersight_command("sidecar", "--data-dir", str(data_dir), "--host", host, "--port", str(port), *extra)


def prober_command(run_dir: Path, spec: ProbeSpec | None, cross: CrossScoreSpec | None = None) -> list[str]:
    """The prober: scheduled probe rounds (`spec`), continuous cross-scoring (`cross`), or both in one
    process; it reads the fleet's replicas and store from the state file every round."""
    cmd = infersight_command("probe", "--fleet", str(run_dir))
    if cross is not None:
        cmd += cross.arguments()
    if spec is None:
        return cmd
    cmd += ["--every", f"{spec.interval:g}s"]
    if spec.token_budget is not None:
        cmd += ["--token-budget", str(spec.token_budget)]
    if spec.rescore:
        cmd += ["--rescore", str(spec.rescore)]
    return cmd + ([] if spec.batched else ["--no-batched"])


def _port(wanted: int, host: str, what: str) -> int:
    if not wanted:
        return free_port(host)
    if port_in_use(wanted, host):
        raise RuntimeError(f"{what}: port {wanted} is already in use (is another fleet up? `infersight fleet status`)")
    return wanted


def fleet_up(config: FleetConfig, progress=_noop) -> FleetState:
    run_dir = Path(config.run_dir).resolve()
    state_path = run_dir / "state.json"
    if state_path.exists():
        old = FleetState.load(run_dir)
        if any(alive(p.ref) for p in _processes(old)):
            raise RuntimeError(f"fleet {old.name!r} is already up (state in {run_dir}); "
                               f"`infersight fleet down --run-dir {run_dir}` first")
    logs = run_dir / "logs"
    host = config.host
    base_dir = config.source.parent if config.source else None
    models = {r.id: resolve_model(r.model, base_dir) for r in config.replicas}  # fails before anything starts
    vllm_pythons = {r.id: vllm_python(r, base_dir) for r in config.replicas if r.kind == "vllm"}
    for r in config.replicas:
        if r.kind == "vllm" and r.plugin and (config.sidecar.url or config.sidecar.enabled):
            check_plugin(vllm_pythons[r.id])
    state = FleetState(name=config.name, run_dir=str(run_dir), created=time.time(), store_url="",
                       stop_timeout=config.stop_timeout, max_restarts=config.max_restarts)
    try:
        sc = config.sidecar
        if sc.url:
            state.store_url = sc.url
        elif sc.enabled:  # spawned first, waited for last: it starts while the replicas load their models
            data_dir = Path(sc.data_dir) if sc.data_dir else run_dir / "store"
            port = _port(sc.port, host, "sidecar")
            cmd = sidecar_command(data_dir, host, port, list(sc.args))
            ref = spawn(cmd, logs / "sidecar.log")
            state.sidecar = ProcessState("sidecar", ref.pid, ref.start_ticks, f"http://{host}:{port}", port, cmd,
                                         str(logs / "sidecar.log"))
            state.store_url = state.sidecar.url
            state.save()
            progress(f"starting the sidecar on port {port} (store {data_dir})")
        for spec in config.replicas:
            port = _port(spec.port, host, f"replica {spec.id}")
            if spec.kind == "vllm":  # vLLM on a port of its own, its recording proxy on the replica's
                spools = (replica_spool_dir(run_dir, spec.id), replica_spool_dir(run_dir, f"{spec.id}-proxy"))
                upstream, replica = start_vllm_replica(spec, vllm_pythons[spec.id], models[spec.id], host, port,
                                                       state.store_url or None, spools, logs, config.log_level,
                                                       state.created)
                state.upstreams.append(upstream)
                state.replicas.append(replica)
                continue
            cmd = replica_command(spec, models[spec.id], host, port, state.store_url or None, config.log_level,
                                  replica_spool_dir(run_dir, spec.id), state.created)
            log = logs / f"{spec.id}.log"
            ref = spawn(cmd, log, spec.env)
            state.replicas.append(ProcessState(spec.id, ref.pid, ref.start_ticks, f"http://{host}:{port}", port, cmd,
                                               str(log), restart=spec.restart, env=dict(spec.env), cpus=spec.cpus,
                                               numa_node=spec.numa_node, model=str(models[spec.id])))
        state.save()
        progress(f"starting {len(state.replicas)} replica(s): " + ", ".join(r.name for r in state.replicas))
        if state.sidecar:  # replicas that come up first spool their telemetry and replay it: nothing is lost
            wait_healthy(state.sidecar.url, state.sidecar.ref, config.startup_timeout, Path(state.sidecar.log),
                         SIDECAR_HEALTH)
            progress(f"sidecar healthy at {state.sidecar.url}")
        with ThreadPoolExecutor(max_workers=max(1, len(state.replicas) + len(state.upstreams))) as pool:
            waits = [pool.submit(wait_healthy, r.url, r.ref, config.startup_timeout, Path(r.log))
                     for r in state.upstreams + state.replicas]  # an upstream that dies is named with its log
            for r, w in zip(state.upstreams + state.replicas, waits):
                w.result()
                progress(f"replica {r.name} healthy at {r.url}")
            # traffic is sent once every replica decodes on the path it keeps (processes.wait_compiled)
            builds = [pool.submit(wait_compiled, r.url, config.startup_timeout) for r in state.replicas]
            for r, b in zip(state.replicas, builds):
                compiled, waited = b.result()
                if compiled == "building":
                    progress(f"replica {r.name} still builds its compiled decode steps after {waited:.0f} s: it serves "
                             "eager steps until they are built")
                elif compiled in ("ready", "failed"):
                    progress(f"replica {r.name}: compiled decode steps {compiled} ({waited:.0f} s after healthy)")
        state.note("fleet up")
        state.save()
        probe = config.probe if config.probe and config.probe.enabled else None
        cross = config.cross_score if config.cross_score.wanted(state.sidecar is not None, len(state.replicas)) \
            else None
        if probe or cross:  # after the replicas: its first round finds them all up
            cmd = prober_command(run_dir, probe, cross)
            ref = spawn(cmd, logs / "prober.log")
            state.prober = ProcessState("prober", ref.pid, ref.start_ticks, "", 0, cmd, str(logs / "prober.log"))
            state.save()
            what = ([f"probing every {probe.interval:g} s"] if probe else []) + (
                [f"cross-scoring {cross.settings.share:g} of each replica's requests"] if cross else [])
            progress(f"{' and '.join(what)} (log {state.prober.log})")
        return state
    except BaseException:
        stop_all(state, timeout=config.stop_timeout)
        FleetState.remove(run_dir)
        raise


def _processes(state: FleetState) -> list[ProcessState]:
    procs = [p for p in (state.supervisor, state.prober) if p]
    procs += state.replicas + state.upstreams
    return procs + ([state.sidecar] if state.sidecar else [])


def stop_all(state: FleetState, timeout: float | None = None) -> dict[str, str]:
    """Supervisor and prober, then replicas (in parallel), then the sidecar. -> {name: outcome}."""
    timeout = state.stop_timeout if timeout is None else timeout
    outcome: dict[str, str] = {}
    # proxies drain before the servers behind them; every recorder flushes before the sidecar goes
    groups = [[p for p in (state.supervisor, state.prober) if p], state.replicas, state.upstreams,
              [state.sidecar] if state.sidecar else []]
    for group in groups:
        if not group:
            continue
        result = stop([p.ref for p in group], timeout)
        for p in group:
            outcome[p.name] = result.get(p.pid, "not running")
    return outcome


def fleet_down(run_dir: str | Path, timeout: float | None = None) -> dict[str, str]:
    state = FleetState.load(run_dir)
    if state.supervisor:  # stop it first, then re-read: it may have restarted a replica meanwhile
        stop([state.supervisor.ref], state.stop_timeout)
        state = FleetState.load(run_dir)
        state.supervisor = None
    outcome = stop_all(state, timeout)
    FleetState.remove(run_dir)
    return outcome


def fleet_status(state: FleetState, timeout: float = 2.0) -> list[dict]:
    """One row per process: name, kind, pid, url, running, healthy, and the replica's own /health."""
    rows = []
    with httpx.Client(timeout=timeout) as client:
        for p in _processes(state):
            kind = ("supervisor" if p is state.supervisor else "prober" if p is state.prober
                    else "sidecar" if p is state.sidecar
                    else "upstream" if p in state.upstreams else "replica")
            row = {"name": p.name, "kind": kind, "pid": p.pid, "url": p.url, "running": alive(p.ref),
                   "healthy": False, "restarts": p.restarts, "cpus": p.cpus, "log": p.log, "detail": {}}
            if row["running"] and p.url:
                path = SIDECAR_HEALTH if kind == "sidecar" else "/health"
                try:
                    resp = client.get(p.url + path)
                    row["healthy"] = resp.status_code == 200
                    if kind == "replica":
                        row["detail"] = resp.json()
                except (httpx.HTTPError, ValueError):
                    pass
            elif kind in ("supervisor", "prober"):  # no endpoint of their own: running is healthy
                row["healthy"] = row["running"]
            rows.append(row)
    return rows
