"""A client that goes away frees its KV blocks; request id, trace id and workload reach the store."""

from __future__ import annotations

import socket
import time

import httpx
from store_polling import stored_request


def _long_request(live, stream: bool) -> dict:
    return {"model": live.served.name, "prompt": "disconnect me", "max_tokens": 900, "ignore_eos": True,
            "stream": stream}


def test_streaming_client_disconnect_aborts_and_frees_kv(live, store):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=_long_request(live, True),
                      headers={"X-Request-Id": "gone-stream"}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            busy = live.health()
            assert busy["running"] == 1 and busy["kv_blocks_used"] > 0
        # leaving the block closes the connection mid-stream
    idle = live.wait_idle()
    assert (idle["running"], idle["kv_blocks_used"], idle["in_flight"]) == (0, 0, 0)
    live.flush()
    row = stored_request(store, "gone-stream")
    assert len(row) == 1 and row["finish_reason"][0] == "abort"
    assert 0 < row["output_tokens"][0] < 900


def test_non_streaming_client_disconnect_aborts_and_frees_kv(live, store):
    # a raw socket: send the request, wait until the engine runs it, hang up
    body = httpx.Request("POST", live.url + "/v1/completions", json=_long_request(live, False),
                         headers={"X-Request-Id": "gone-full"})
    raw = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"X-Request-Id: gone-full\r\nContent-Length: {len(body.read())}\r\n\r\n").encode() + body.read()
    sock = socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    sock.sendall(raw)
    deadline = time.monotonic() + 20
    while live.health()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live.health()["kv_blocks_used"] > 0
    sock.close()
    idle = live.wait_idle()
    assert (idle["running"], idle["kv_blocks_used"], idle["in_flight"]) == (0, 0, 0)
    live.flush()
    row = stored_request(store, "gone-full")
    assert len(row) == 1 and row["finish_reason"][0] == "abort" and row["output_tokens"][0] < 900


def test_traceparent_and_workload_are_recorded(live, store):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"X-Request-Id": "traced-1", "X-Workload": "agent",
               "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    r = httpx.post(live.url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": live.served.name, "messages": [{"role": "user", "content": "trace me"}], "max_tokens": 3,
        "return_token_ids": True})
    assert r.status_code == 200
    untraced = httpx.post(live.url + "/v1/completions", headers={"X-Request-Id": "untraced-1"}, timeout=60,
                          json={"model": live.served.name, "prompt": "x", "max_tokens": 2})
    assert untraced.status_code == 200
    live.flush()
    row = stored_request(store, "traced-1")
    assert row["trace_id"][0] == trace_id
    assert row["workload"][0] == "agent"
    assert list(row["output_token_ids"][0]) == r.json()["choices"][0]["token_ids"]
    assert list(row["prompt_token_ids"][0]) == r.json()["prompt_token_ids"]
    other = stored_request(store, "untraced-1")
    assert len(other["trace_id"][0]) == 32 and other["trace_id"][0] != trace_id  # a trace of its own
    assert other["workload"][0] == ""
