"""A real Prometheus (Debian's `prometheus` binary) on a free loopback port, for the tests that need one."""

from __future__ import annotations

import contextlib
import shutil
import subprocess

import pytest
import yaml
from dashboard_process import wait_answering

from engine.util import free_port


@contextlib.contextmanager
def running_prometheus(tmp, scrape_configs: list[dict], rule_files: list[str] = ()):
    """Yields its URL; scrapes and evaluates every second; stopped on exit. `tmp`: its own directory."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the `prometheus` binary is missing: run .ci/setup (Debian package prometheus)")
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": scrape_configs,
    }))
    port = free_port()
    log = open(tmp / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(f"{url}/-/ready", proc, tmp / "prometheus.log", 30, "prometheus")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
