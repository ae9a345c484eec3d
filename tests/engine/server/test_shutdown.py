"""`infersight serve` as its own process: SIGTERM drains in-flight requests (bounded) and flushes telemetry."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import pytest

from engine.serving.processes import infersight_command, process_ref, wait_healthy
from engine.util import free_port


def _serve(model, store_url: str, replica: str, drain: float):
    port = free_port()
    cmd = infersight_command("serve", "--model", str(model), "--port", str(port), "--replica-id", replica,
                             "--store", store_url, "--drain-timeout", str(drain), "--threads", "1",
                             "--log-level", "warning")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process_ref(proc.pid), 120)
    except RuntimeError:
        proc.kill()
        raise AssertionError(proc.communicate()[0][-3000:]) from None
    return proc, url


def _in_background(url: str, body: dict, request_id: str) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def call():
        try:
            result["response"] = httpx.post(url + "/v1/completions", json=body, timeout=120,
                                            headers={"X-Request-Id": request_id})
        except httpx.HTTPError as e:
            result["error"] = e

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while httpx.get(url + "/health").json()["running"] == 0:  # it is in the engine now
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    return thread, result


@pytest.mark.slow
def test_sigterm_drains_in_flight_then_exits(tiny_llama, sidecar_url, store):
    proc, url = _serve(tiny_llama, sidecar_url, "drain-test", drain=60)
    try:
        body = {"model": tiny_llama.name, "prompt": "drain", "max_tokens": 100, "ignore_eos": True,
                "return_token_ids": True}
        thread, result = _in_background(url, body, "drain-1")
        proc.send_signal(signal.SIGTERM)
        thread.join(120)
        r = result["response"]
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 100  # finished, not cut
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    # the recorder flushed before the process exited
    df = store.query_df("SELECT output_token_ids FROM requests WHERE request_id = 'drain-1'")
    assert len(df) == 1 and list(df["output_token_ids"][0]) == r.json()["choices"][0]["token_ids"]


def test_drain_is_bounded_and_cut_requests_free_their_blocks(live):
    """A second app on the live engine, draining for 0.1 s: a long request is cut, its KV blocks come back.
    (0.1 s, not 1 s: the tiny model writes 900 tokens in about a second on a fast host.)"""
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer

    server = BackgroundServer(build_app(live.served, manage_engine=False), drain_timeout=0.1).start()
    body = {"model": live.served.name, "prompt": "endless", "max_tokens": 900, "ignore_eos": True}
    thread, result = _in_background(server.url, body, "drain-2")
    server.stop()  # what SIGTERM does: stop accepting, drain (bounded), cancel the rest
    assert not server.thread.is_alive()
    thread.join(60)
    r = result.get("response")
    assert r is None or r.status_code != 200 or r.json()["usage"]["completion_tokens"] < 900
    idle = live.wait_idle()
    assert (idle["running"], idle["kv_blocks_used"]) == (0, 0)
