"""A request whose body stops arriving is closed by the body deadline (telemetry/connections.py) with a 408, and
is a row like any request the server received, on a replica and on the recording proxy: the 408 the client
got, `client_timeout` (the client's doing: outcome aborted, never a failure of the replica), its request id
and workload. Real servers with the connection guard on loopback, rows in a real store."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from engine.serving.server.background import BackgroundServer
from telemetry.connections import ConnectionLimits
from telemetry.contract.outcomes import ABORTED, outcome_of

GUARD = ConnectionLimits(header_timeout_seconds=5, body_timeout_seconds=1)


@pytest.fixture(scope="module")
def servers(tiny_llama, store):
    """A replica (its rows as `rep`) and a recording proxy in front of it (as `px`), both guarded."""
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.proxy.app import RecordingProxy
    from engine.serving.server.app import build_app
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    config = EngineConfig(model=str(tiny_llama), max_model_len=256, num_kv_blocks=32, block_size=16, max_num_seqs=4,
                          replica_id="rep")
    observer, parts = build_observer("rep", Path(tiny_llama).name, store_target=store, metrics=False)
    served = ServedModel.from_engine(AsyncLLM(config, observer), created=int(time.time()))
    proxy_observer, proxy_parts = build_observer("px", "proxied", store_target=store, metrics=False)
    try:
        with BackgroundServer(build_app(served), http=GUARD.protocol()) as replica:
            proxy = RecordingProxy(replica.url, proxy_observer, "px", replica_row=False)
            with BackgroundServer(proxy.app(), http=GUARD.protocol()) as proxied:
                yield {"rep": (replica, parts), "px": (proxied, proxy_parts)}
    finally:
        proxy_parts.close()
        parts.close()


def _stall(port: int, request_id: str) -> bytes:
    """Headers and a third of the body, then nothing: what the server answers before it closes."""
    body = b'{"model": "x", "prompt": "hello", "max_tokens": 2}'
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-Id: {request_id}\r\nX-Workload: chat\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body[:len(body) // 3])
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer


def _row(store, parts, request_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        parts.recorder.flush()
        df = store.query_df("SELECT replica_id, http_status, error_code, finish_reason, workload FROM requests "
                            "WHERE request_id = {id:String}", {"id": request_id})
        if len(df) or time.monotonic() > deadline:
            return df.to_dict("records")
        time.sleep(0.3)


@pytest.mark.parametrize("which", ["rep", "px"])
def test_a_body_closed_by_its_deadline_is_a_row_of_the_408_it_got(servers, store, which):
    server, parts = servers[which]
    request_id = f"stalled-{which}-{uuid.uuid4().hex[:8]}"
    answer = _stall(server.port, request_id)
    assert answer.startswith(b"HTTP/1.1 408")
    rows = _row(store, parts, request_id)
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["replica_id"], row["http_status"], row["error_code"], row["workload"]) == \
        (which, 408, "client_timeout", "chat")
    assert outcome_of(row["error_code"], row["finish_reason"]) == ABORTED
