"""Watch a fleet's replicas: report the ones that die, restart the ones configured to restart.

Runs inside `fleet up --foreground`, or as its own detached process
(`infersight fleet supervise --run-dir D`, started by `fleet up` when a
replica has `restart = true`). A replica restarts on the same port with the
same command; after `max_restarts` it is left down and reported.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from engine.serving.processes import alive, log_tail, spawn, wait_healthy
from engine.serving.fleet.state import FleetState

STARTUP_TIMEOUT = 180.0


def check_once(run_dir: str | Path, report=print) -> FleetState:
    """One pass over the replicas; returns the (possibly updated and saved) state."""
    state = FleetState.load(run_dir)
    changed = False
    for r in state.replicas + state.upstreams:  # a vLLM replica's server dies on its own, apart from its proxy
        if r.stopped or alive(r.ref):
            continue
        tail = log_tail(Path(r.log), 5)
        message = f"replica {r.name} (pid {r.pid}, {r.url}) died"
        report(message + (f"; last log lines:\n{tail}" if tail else ""))
        state.note(message)
        changed = True
        if not r.restart:
            r.stopped = True
            continue
        if r.restarts >= state.max_restarts:
            report(f"replica {r.name}: not restarted again ({r.restarts} restarts, max_restarts={state.max_restarts})")
            state.note(f"replica {r.name} given up after {r.restarts} restarts")
            r.stopped = True
            continue
        ref = spawn(r.cmd, Path(r.log), r.env, append=True)
        r.pid, r.start_ticks, r.restarts = ref.pid, ref.start_ticks, r.restarts + 1
        state.save()  # `fleet down` must find the new pid even while it starts
        try:
            wait_healthy(r.url, ref, STARTUP_TIMEOUT, Path(r.log))
            report(f"replica {r.name} restarted (pid {r.pid}, restart #{r.restarts})")
            state.note(f"replica {r.name} restarted as pid {r.pid}")
        except RuntimeError as e:
            report(f"replica {r.name}: restart failed: {e}")
            state.note(f"replica {r.name} restart #{r.restarts} failed")
    if changed:
        state.save()
    return state


def supervise(run_dir: str | Path, interval: float = 2.0, stop: threading.Event | None = None,
              report=print) -> None:
    """Check every `interval` seconds until `stop` is set, SIGTERM arrives, or the fleet is gone."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        try:
            check_once(run_dir, report)
        except ValueError:  # the state file is gone: the fleet was brought down
            return
        stop.wait(interval)
