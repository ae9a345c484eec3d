"""Run one side over all workloads in a fresh subprocess; its peak RSS is the driver's VmHWM.

The request and the result travel as JSON files (see `_driver_io`); the child's stdout and stderr go to
a log whose tail is kept when it fails. The child is reaped with wait4, whose rusage is that child's
alone (getrusage(RUSAGE_CHILDREN) would mix sides), but whose ru_maxrss starts at this process's own
peak (Linux keeps it across fork and exec), so the driver's VmHWM (see `_driver_io`) is preferred.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass

from engine.benchmarks.peers.sides import HERE, Peer, child_env


@dataclass
class SideRun:
    ok: bool
    result: dict
    peak_rss_mib: float
    wall_s: float
    error: str = ""


def run_side(peer: Peer, python: str, request: dict, timeout_s: float) -> SideRun:
    with tempfile.TemporaryDirectory(prefix="infersight-peers-") as tmp:
        req_path, out_path, log_path = (os.path.join(tmp, n) for n in ("request.json", "result.json", "log.txt"))
        with open(req_path, "w") as f:
            json.dump(request, f)
        start = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, str(HERE / peer.driver), req_path, out_path], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(peer),
                                    cwd=tmp, start_new_session=True)
            status, usage = _wait(proc, timeout_s)
        wall = time.perf_counter() - start
        rss = usage.ru_maxrss / 1024 if usage else float("nan")  # kB on Linux
        if status != 0 or not os.path.exists(out_path):
            tail = open(log_path, errors="replace").read()[-1500:]
            why = "timed out" if status is None else f"exit status {status}"
            if status == -4:  # SIGILL: llama.cpp's AMX kernels where the machine does not grant AMX (README)
                why += " (SIGILL: an instruction this machine refuses; llama.cpp: build it without AMX)"
            return SideRun(False, {}, rss, wall, f"{why}; log tail:\n{tail}")
        with open(out_path) as f:
            result = json.load(f)
        # Linux starts a child's ru_maxrss at its parent's peak (kept across fork and exec): the driver's
        # VmHWM is its own; wait4's number is the fallback (and what a failed side reports)
        return SideRun(True, result, result.get("vm_hwm_mib") or rss, wall)


def _wait(proc: subprocess.Popen, timeout_s: float):
    """(exit status or None on timeout, rusage); reaps the child with wait4 instead of Popen.wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > deadline:
            os.killpg(proc.pid, 9)
            _, _, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return None, usage
        time.sleep(0.1)
