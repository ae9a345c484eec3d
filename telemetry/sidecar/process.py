"""Run a sidecar as a subprocess (tests, the fleet): start it, wait until /ping answers, stop it."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from urllib.parse import quote

import httpx

_READY = re.compile(r"serving (https?://\S+)")


class SidecarProcess:
    """A running sidecar. `.url` (no credentials), `.store_url` (with them: pass to open_store /
    Recorder), `.port`, `.stop()` (graceful), `.kill()` (SIGKILL, as a crash), `.output()`."""

    def __init__(self, process: subprocess.Popen, url: str, data_dir: Path, user: str | None, password: str,
                 lines: deque):
        self.process, self.url, self.data_dir = process, url, data_dir
        self.port = int(url.rsplit(":", 1)[1])
        self._lines = lines
        if user:
            scheme, rest = url.split("://", 1)
            self.store_url = f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{rest}"
        else:
            self.store_url = url

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return "".join(self._lines)

    def stop(self, timeout: float = 20) -> int:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> int:
        if self.alive():
            self.process.kill()
        return self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_sidecar(data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1", user: str | None = None,
                  password: str = "", readonly_user: str | None = None, readonly_password: str = "",
                  tls_cert: str | None = None, tls_key: str | None = None,
                  extra_args: tuple[str, ...] = (), timeout: float = 90,
                  wrapper: tuple[str, ...] = ()) -> SidecarProcess:
    """Start `infersight sidecar` on `data_dir` (port 0: a free port) and wait until it serves.
    `wrapper`: a command the sidecar runs under (e.g. setpriv, to drop a capability)."""
    args = [*wrapper, sys.executable, "-m", "dashboards.console.cli", "sidecar", "--data-dir", str(data_dir), "--port", str(port),
            "--host", host, "--log-level", "warning", *extra_args]
    env = dict(os.environ)
    if user:
        args += ["--user", user]
        env["INFERSIGHT_SIDECAR_PASSWORD"] = password  # not on the command line, where ps shows it
    if tls_cert:
        args += ["--tls-cert", str(tls_cert), "--tls-key", str(tls_key)]
    if readonly_user:
        args += ["--readonly-user", readonly_user]
        env["INFERSIGHT_SIDECAR_READONLY_PASSWORD"] = readonly_password
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: deque = deque(maxlen=200)
    ready: list[str] = []
    got_url = threading.Event()

    def pump():  # keep reading output so the pipe never fills and blocks the sidecar
        for line in process.stdout:
            lines.append(line)
            if not ready and (m := _READY.search(line)):
                ready.append(m.group(1))
                got_url.set()
        got_url.set()

    threading.Thread(target=pump, daemon=True, name=f"sidecar-{process.pid}-output").start()
    deadline = time.monotonic() + timeout
    got_url.wait(timeout)
    if not ready:
        process.kill()
        raise RuntimeError(f"sidecar did not start (exit {process.poll()}):\n{''.join(lines)}")
    handle = SidecarProcess(process, ready[0], Path(data_dir), user, password, lines)
    verify = ssl.create_default_context(cafile=str(tls_cert)) if tls_cert else True
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{handle.url}/ping", timeout=2, verify=verify).text == "Ok.\n":
                return handle
        except httpx.HTTPError:
            pass
        if not handle.alive():
            break
        time.sleep(0.05)
    handle.kill()
    raise RuntimeError(f"sidecar at {handle.url} did not answer /ping:\n{handle.output()}")
