"""An `infersight proxy` process for the benchmarks that measure it (proxy_overhead, proxy_asks, vllm_overhead)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from engine.core.model_refs import REFERENCE_MODEL
from engine.util import free_port


def start_proxy(upstream: str, store_url: str, work: Path, *, replica_id: str,
                replica_row: bool = True, extra_args: tuple[str, ...] = (),
                model_dir: str | Path = REFERENCE_MODEL) -> tuple[subprocess.Popen, str]:
    """`infersight proxy` in front of `upstream`, recording into `store_url`, in a session of its own (its log and
    spool in `work`); returns it and its URL once /health answers."""
    port = free_port()
    log = open(work / "proxy.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "dashboards.console.cli", "proxy", "--upstream", upstream,
                                "--store", store_url, "--port", str(port), "--replica-id", replica_id,
                                "--model-dir", str(model_dir), "--spool-dir", str(work / "proxy-spool"),
                                "--log-level", "warning", *([] if replica_row else ["--no-replica-row"]), *extra_args],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the proxy did not come up: see {work / 'proxy.log'}")
