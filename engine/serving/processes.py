"""Start, watch and stop local processes (a fleet's sidecar and replicas, a test's or benchmark's server).

Each process runs in its own session (its own process group), so it outlives
`fleet up`, a terminal's Ctrl-C does not reach it, and stopping it stops
whatever it started. A pid alone can be reused by the OS after a process
dies, so a process is identified by (pid, start time in clock ticks since
boot, from /proc/<pid>/stat).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ProcessRef:
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: tells a reused pid apart

    def to_dict(self) -> dict:
        return {"pid": self.pid, "start_ticks": self.start_ticks}


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of a process, None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[19])


def process_ref(pid: int) -> ProcessRef:
    stat = _stat(pid)
    return ProcessRef(pid, stat[1] if stat else 0)


def alive(ref: ProcessRef) -> bool:
    """The very process of `ref` still runs (not a zombie, not a new process with the same pid)."""
    try:  # reap it if it is our child, so it does not linger as a zombie
        os.waitpid(ref.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    stat = _stat(ref.pid)
    return stat is not None and stat[0] not in ("Z", "X") and (not ref.start_ticks or stat[1] == ref.start_ticks)


def infersight_command(*args: str) -> list[str]:
    """`infersight ARGS` with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "dashboards.console.cli", *args]


def spawn(cmd: list[str], log_path: Path, env: dict | None = None, append: bool = False) -> ProcessRef:
    """Start `cmd` in its own session, output to `log_path` (appended to with `append`: a restart)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})
    return process_ref(proc.pid)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(url: str, ref: ProcessRef, timeout: float, log_path: Path | None = None,
                 health_path: str = "/health") -> None:
    """Poll `url + health_path` until it answers 200; RuntimeError (with the log's tail) if the process dies."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while True:
            if not alive(ref):
                tail = log_tail(log_path) if log_path else ""
                raise RuntimeError(f"process {ref.pid} ({url}) exited during startup" + (f":\n{tail}" if tail else ""))
            try:
                if client.get(url + health_path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not healthy after {timeout:.0f} s (pid {ref.pid}, log {log_path})")
            time.sleep(0.25)


def wait_compiled(url: str, timeout: float) -> tuple[str | None, float]:
    """Poll a healthy replica's /health until its compiled decode steps are no longer "building" (see
    ModelRunner.compile_state). -> (the state it ended in, or "building" past `timeout`; None for a server
    whose /health does not say, e.g. a vLLM proxy), seconds waited.

    A replica serves eager decode steps while it builds them; traffic sent then is served ~1.5-3x slower per
    token than after, which a comparison of replicas would read as one replica lagging. A fleet that starts
    its traffic after this wait compares replicas on the path they keep."""
    started = time.monotonic()
    deadline = started + timeout
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                state = client.get(url + "/health").json().get("compiled_decode")
            except (httpx.HTTPError, ValueError, AttributeError):  # gone or not a replica's /health: the
                return None, time.monotonic() - started          # fleet's own checks name that, not this wait
            if state != "building" or time.monotonic() > deadline:
                return state, time.monotonic() - started
            time.sleep(0.25)


def stop(refs: list[ProcessRef], timeout: float = 15.0) -> dict[int, str]:
    """SIGTERM each process group, SIGKILL what is still there after `timeout`. -> {pid: how it ended}."""
    outcome: dict[int, str] = {}
    pending = []
    for ref in refs:
        if not alive(ref):
            outcome[ref.pid] = "not running"
            continue
        _signal_group(ref.pid, signal.SIGTERM)
        pending.append(ref)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        for ref in [r for r in pending if not alive(r)]:
            outcome[ref.pid] = "stopped"
            pending.remove(ref)
    for ref in pending:
        _signal_group(ref.pid, signal.SIGKILL)
        outcome[ref.pid] = f"killed (still running {timeout:.0f} s after SIGTERM)"
    for ref in pending:  # SIGKILL is not instant
        for _ in range(50):
            if not alive(ref):
                break
            time.sleep(0.05)
    return outcome


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the group: the process and whatever it started
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
