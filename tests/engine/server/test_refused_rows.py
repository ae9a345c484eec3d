"""Every generation request the replica receives is a `requests` row, the refused ones too: by request id,
what was sent is what is stored, with the status the client got, the error code of the fixed vocabulary
(telemetry/contract/outcomes.py), the field a 400 named, a length refusal's prompt length and limit; and
/metrics counts the refusals by reason."""

from __future__ import annotations

import json
import time
import uuid

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.serving.server.app import build_app
from engine.serving.server.background import BackgroundServer
from tests.engine.server.conftest import MAX_MODEL_LEN
from tests.engine.server.test_flood import _metrics, _sum


def _rows(store, ids: list[str], timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        df = store.query_df("SELECT request_id, http_status, error_code, error_param, error_detail_json, "
                            "prompt_tokens, workload, finish_reason, error FROM requests "
                            "WHERE request_id IN {ids:Array(String)}", {"ids": ids})
        if len(df) >= len(ids) or time.monotonic() > deadline:
            return df
        time.sleep(0.3)


def test_each_refusal_is_one_row_with_its_status_code_and_numbers(live, client, store):
    model, tag = live.served.name, uuid.uuid4().hex[:8]
    long_prompt = " ".join(["token"] * (MAX_MODEL_LEN + 50))  # tokenizes past the context, fits the char bound
    sent = {  # request id -> (body, expected status, expected error_code, expected param)
        f"{tag}-ok": ({"model": model, "prompt": "hello", "max_tokens": 2}, 200, "", ""),
        f"{tag}-bad": ({"model": model, "prompt": "hello", "max_tokens": 2, "temperature": -1}, 400,
                       "invalid_request", "temperature"),
        f"{tag}-unknown": ({"model": model, "prompt": "hello", "nonsense": 1}, 400, "invalid_request", "nonsense"),
        f"{tag}-model": ({"model": "other", "prompt": "hello"}, 404, "invalid_request", "model"),
        f"{tag}-long": ({"model": model, "prompt": long_prompt, "max_tokens": 2}, 400, "context_length", "prompt"),
    }
    before = _metrics(live.url)
    for request_id, (body, status, _, _) in sent.items():
        r = client.post("/v1/completions", json=body, headers={"X-Request-Id": request_id, "X-Workload": "chat"})
        assert r.status_code == status, r.text
    r = client.post("/v1/chat/completions", content=b"{not json", headers={
        "X-Request-Id": f"{tag}-json", "Content-Type": "application/json"})
    assert r.status_code == 400
    live.flush()
    ids = [*sent, f"{tag}-json"]
    rows = _rows(store, ids).set_index("request_id")
    assert sorted(rows.index) == sorted(ids)  # each one row, none twice
    for request_id, (_, status, code, param) in sent.items():
        row = rows.loc[request_id]
        assert (row["error_code"], row["workload"]) == (code, "chat"), request_id
        if status != 200:
            assert (row["http_status"], row["error_param"], row["finish_reason"]) == (status, param, "error")
            assert row["error"], request_id  # the message the client got
    assert rows.loc[f"{tag}-json", "error_code"] == "invalid_request"
    long_row = rows.loc[f"{tag}-long"]
    detail = json.loads(long_row["error_detail_json"])
    assert detail["max_model_len"] == MAX_MODEL_LEN and detail["api_code"] == "context_length_exceeded"
    assert long_row["prompt_tokens"] == detail["prompt_tokens"] > MAX_MODEL_LEN  # the stratum shows it
    after = _metrics(live.url)
    replica = {"replica": live.served.replica_id}
    for reason, n in (("invalid_request", 4), ("context_length", 1)):
        grew = (_sum(after, "infersight_requests_rejected_total", reason=reason, **replica)
                - _sum(before, "infersight_requests_rejected_total", reason=reason, **replica))
        assert grew == n, reason
    # refused requests are not finished requests of the engine (vLLM's request_success does not count them)
    grew = (_sum(after, "infersight_request_success_total", **replica)
            - _sum(before, "infersight_request_success_total", **replica))
    assert grew == 1


def test_a_wrong_api_key_is_a_row(live, store):
    app = build_app(live.served, api_key="s3cret", manage_engine=False)
    request_id = f"auth-{uuid.uuid4().hex[:8]}"
    with BackgroundServer(app) as server:
        r = httpx.post(server.url + "/v1/chat/completions", headers={"X-Request-Id": request_id}, timeout=30,
                       json={"model": live.served.name, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401
    live.flush()
    row = _rows(store, [request_id]).iloc[0]
    assert (row["http_status"], row["error_code"]) == (401, "unauthorized")


_BODIES = st.dictionaries(st.sampled_from(["model", "prompt", "max_tokens", "temperature", "n", "stop", "x"]),
                          st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=5), st.lists(st.integers(0, 9),
                                                                                                  max_size=3)),
                          max_size=5)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_BODIES)
def test_any_body_is_exactly_one_row_with_the_status_it_got(live, client, store, body):
    """Whatever a client sends, the row is there once, with the status it was answered."""
    body = {**body, "max_tokens": 1} if body.get("max_tokens") not in (None, 0, -1, -2, -3) else body
    request_id = f"any-{uuid.uuid4().hex}"
    r = client.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})
    live.flush()
    rows = _rows(store, [request_id])
    assert len(rows) == 1, (body, r.status_code)
    row = rows.iloc[0]
    if r.status_code == 200:
        assert row["error_code"] == ""
    else:
        assert (row["http_status"], row["finish_reason"]) == (r.status_code, "error")
        assert row["error_code"] == ("context_length" if r.json()["error"]["code"] == "context_length_exceeded"
                                     else "invalid_request")


def test_an_engine_failure_is_one_row_the_engines(live, client, store):
    """A request the engine fails is answered 500 and recorded once, by the engine (engine_error), not a
    second time by the HTTP layer."""
    runner = live.served.engine.engine.runner
    request_id = f"fails-{uuid.uuid4().hex[:8]}"

    def broken(*args, **kwargs):
        raise RuntimeError("injected forward failure")

    runner.forward = broken  # the instance attribute shadows the method while it is set
    try:
        r = client.post("/v1/completions", json={"model": live.served.name, "prompt": "hello", "max_tokens": 2},
                        headers={"X-Request-Id": request_id})
    finally:
        del runner.forward
    assert r.status_code == 500
    live.flush()
    rows = _rows(store, [request_id], timeout=10)
    time.sleep(1)  # a second row would come from the same flush; look again after it
    live.flush()
    rows = _rows(store, [request_id], timeout=0)
    assert len(rows) == 1
    assert (rows.iloc[0]["error_code"], rows.iloc[0]["finish_reason"]) == ("engine_error", "error")


def test_a_client_gone_before_its_body_is_read_is_an_abort_not_a_refusal(live, store):
    """A body cut off (the client left, or a body deadline closed it) makes FastAPI answer 400 "error parsing
    the body" to nobody: the row says client_abort (499), which availability does not count against the
    replica, never invalid_request (a slowloris would otherwise get a healthy replica named)."""
    import socket
    from urllib.parse import urlsplit

    request_id = f"cut-{uuid.uuid4().hex[:8]}"
    url = urlsplit(live.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: 500\r\nX-Request-Id: {request_id}\r\n\r\n{{\"prompt\": \"hel".encode())
    live.flush()
    row = _rows(store, [request_id], timeout=60)
    assert list(row["request_id"]) == [request_id]
    assert (row["http_status"][0], row["error_code"][0]) == (499, "client_abort")


class _CancelOnceHeld:
    """ASGI: runs the app as a task of its own and cancels it once the engine holds a request (running or
    waiting), as a shutdown cancels the tasks of requests in flight."""

    def __init__(self, app, served):
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send):
        import asyncio
        import contextlib

        if scope["type"] != "http" or scope["path"] not in ("/v1/completions", "/v1/chat/completions"):
            return await self.app(scope, receive, send)
        started = []

        async def watched(message):
            started.append(message["type"] == "http.response.start")
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, watched))
        deadline = time.monotonic() + 60
        while not task.done() and time.monotonic() < deadline:
            state = self.served.engine_state()
            if state["running"] + state["waiting"]:
                break
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not any(started), "the app answered before the engine held the request"
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def test_a_request_cancelled_while_the_engine_holds_it_is_one_row_the_engines(live, store):
    """The task of a request the engine holds is cancelled (a shutdown does it): the engine's abort is its row
    (client_abort, finish reason abort), and the HTTP layer writes none beside it (it wrote a 499 refusal too)."""
    ids = []
    runner = live.served.engine.engine.runner
    forward = runner.forward

    def slow(*args, **kwargs):  # the first token comes well after the engine holds the request
        time.sleep(0.3)
        return forward(*args, **kwargs)

    runner.forward = slow  # the instance attribute shadows the method while it is set
    try:
        with BackgroundServer(_CancelOnceHeld(build_app(live.served, manage_engine=False), live.served)) as server:
            for stream in (False, True):
                request_id = f"cancelled-{'stream' if stream else 'full'}-{uuid.uuid4().hex[:8]}"
                ids.append(request_id)
                r = httpx.post(server.url + "/v1/completions", timeout=60, headers={"X-Request-Id": request_id},
                               json={"model": live.served.name, "prompt": "hello there", "max_tokens": 20,
                                     "ignore_eos": True, "stream": stream})
                assert r.status_code == 503  # the wrapper's answer: the app's task was cancelled
                live.wait_idle()
    finally:
        del runner.forward
    live.flush()
    _rows(store, ids, timeout=30)
    time.sleep(1)  # a second row would come with the same flush; look again after it
    live.flush()
    rows = _rows(store, ids, timeout=0)
    assert sorted(rows["request_id"]) == sorted(ids)  # one row each
    assert set(zip(rows["error_code"], rows["finish_reason"])) == {("client_abort", "abort")}


def test_a_limit_of_the_engine_below_the_context_is_a_length_refusal_with_its_numbers():
    """Chunked prefill off with a 64-token batch budget refuses longer prompts as the engine words it (a plain
    400): the row is a length refusal with the prompt's length (its stratum) and the limit, as vLLM's are."""
    from engine.serving.server.rejections import refused_record

    message = ("the prompt has 70 tokens; without chunked prefill a prompt must fit in max_num_batched_tokens "
               "(64)")
    for upstream in (None, 400):  # the replica's own refusal, and the same answer through a recording proxy
        row = refused_record({"headers": []}, replica_id="r", model_name="m", status=400, arrival=1.0, finish=1.1,
                             body=json.dumps({"error": {"message": message, "code": None}}).encode(),
                             upstream_status=upstream)
        assert (row.error_code, row.prompt_tokens) == ("context_length", 70)
        assert json.loads(row.error_detail_json)["max_num_batched_tokens"] == 64
