"""Servers a test starts as child processes (`infersight dashboard`, Prometheus): waited for until they answer."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

START_SECONDS = 300  # generous: the first start imports streamlit, pandas, torch on a shared machine


def wait_answering(url: str, process: subprocess.Popen, log_path: Path, seconds: float, what: str) -> None:
    """Until `url` answers 200; fail with the end of the log if `process` exits or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.3)


@contextlib.contextmanager
def running_dashboard(command: list[str], port: int, log_path: Path):
    """Run `command` (an `infersight dashboard ...` that listens on `port`), yield its URL once it answers."""
    with open(log_path, "w") as log:
        # same process group: Ctrl-C or a killed job reaches it
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(f"{url}/_stcore/health", process, log_path, START_SECONDS, "the dashboard")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # the CLI stops Streamlit and its sidecar
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
