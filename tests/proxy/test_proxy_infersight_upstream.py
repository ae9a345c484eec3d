"""The recording proxy in front of infersight's own server: the client sees what it would see
without the proxy, and every answered request is stored with the token IDs the upstream used
(the upstream records its own row of each request, under `up`: the truth the proxy's row is held to)."""

from __future__ import annotations

import json
import math
import uuid

import httpx
import pytest
from proxy_support import rows, sse_payloads, without_volatile

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def completion(model: str, **extra) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "ignore_eos": True, **extra}


def client_params(upstream_params: str) -> str:
    """The upstream's row holds the logprobs the proxy asked for (engine/serving/proxy/extras.py); the proxy's
    row holds the client's parameters (it asked for none)."""
    return json.dumps({**json.loads(upstream_params), "logprobs": None}, sort_keys=True)


def rid() -> str:
    return uuid.uuid4().hex


def headers(request_id: str, workload: str = "chat") -> dict:
    return {"X-Request-Id": request_id, "X-Workload": workload, "traceparent": TRACEPARENT}


def stored_pairs(store, upstream, proxy, ids: list[str]) -> tuple[dict, dict]:
    upstream.flush()
    proxy.flush()
    return rows(store, "up", ids), rows(store, "px", ids)


@pytest.mark.parametrize("path, make", [("/v1/completions", completion), ("/v1/chat/completions", chat)])
def test_a_whole_response_is_what_the_upstream_says_and_its_row_holds_the_upstreams_token_ids(
        clients, upstream, proxy, store, path, make):
    direct, via = clients
    body = make(upstream.model)
    before = proxy.proxy.recorded
    a = direct.post(path, json=body, headers={"X-Request-Id": rid()})
    request_id = rid()
    b = via.post(path, json=body, headers=headers(request_id))
    assert a.status_code == b.status_code == 200
    # the client asked for no token IDs: the ones the proxy asked for are not in its answer
    assert without_volatile(b.json()) == without_volatile(a.json())
    assert "prompt_token_ids" not in b.json() and "token_ids" not in b.json()["choices"][0]
    assert b.headers["x-request-id"] == request_id
    assert b.json()["id"].endswith(request_id)  # the upstream used our id

    proxy.wait_recorded(before + 1)
    truth, mine = stored_pairs(store, upstream, proxy, [request_id])
    t, m = truth[request_id], mine[request_id]
    for column in ("prompt_token_ids", "output_token_ids"):
        assert list(m[column]) == list(t[column]) and len(t[column]) > 0
    for column in ("prompt_text_hash", "workload", "trace_id", "finish_reason", "prompt_tokens", "output_tokens",
                   "model_name"):
        assert m[column] == t[column], column
    assert m["sampling_params_json"] == client_params(t["sampling_params_json"])
    assert m["trace_id"] == TRACEPARENT.split("-")[1] and m["workload"] == "chat"
    # a whole response has no per-token times: its TTFT is unknown (nan, kept out of the percentiles), not 0;
    # nor does the proxy see the upstream's queue and prefill
    assert list(m["token_times"]) == [] and math.isnan(m["ttft_seconds"])
    assert math.isnan(m["queue_seconds"]) and math.isnan(m["prefill_seconds"])
    assert m["first_token_time"].timestamp() == 0 and m["e2e_seconds"] > 0


@pytest.mark.parametrize("path, make", [("/v1/completions", completion), ("/v1/chat/completions", chat)])
def test_a_stream_keeps_its_events_and_its_row_has_a_time_per_token(clients, upstream, proxy, store, path, make):
    direct, via = clients
    body = make(upstream.model, stream=True)
    before = proxy.proxy.recorded
    a = direct.post(path, json=body, headers={"X-Request-Id": rid()})
    request_id = rid()
    b = via.post(path, json=body, headers=headers(request_id, "agent"))
    assert a.status_code == b.status_code == 200
    assert b.headers["content-type"].startswith("text/event-stream")
    ours, theirs = sse_payloads(b.text), sse_payloads(a.text)
    # the same events, one for one (chunk boundaries as the upstream cut them), with the same fields
    assert len(ours) == len(theirs) > 2
    for x, y in zip(ours, theirs):
        assert (x if x == "[DONE]" else without_volatile(x)) == (y if y == "[DONE]" else without_volatile(y))
    assert not any("token_ids" in json.dumps(x) for x in ours)

    proxy.wait_recorded(before + 1)
    truth, mine = stored_pairs(store, upstream, proxy, [request_id])
    t, m = truth[request_id], mine[request_id]
    assert list(m["prompt_token_ids"]) == list(t["prompt_token_ids"])
    assert list(m["output_token_ids"]) == list(t["output_token_ids"])
    assert m["output_tokens"] == len(m["token_times"]) == len(t["output_token_ids"]) == body["max_tokens"]
    assert list(m["token_times"]) == sorted(m["token_times"]) and m["token_times"][0] > 0
    assert m["ttft_seconds"] == pytest.approx(m["token_times"][0], abs=1e-5)
    assert math.isnan(m["queue_seconds"]) and math.isnan(m["prefill_seconds"])  # the upstream's, unseen
    assert m["workload"] == "agent" and m["sampling_params_json"] == client_params(t["sampling_params_json"])
    assert m["finish_reason"] == t["finish_reason"] == "length"


def test_the_ttft_percentiles_hold_only_the_requests_whose_first_token_was_seen(clients, upstream, proxy, store):
    """Every request shape through the proxy: a stream's TTFT is measured, a whole response's is unknown,
    and the TTFT quantiles every view shows (derived.TTFT_QUANTILES_SQL) are the measured ones alone."""
    from telemetry.contract import derived

    via = clients[1]
    before = proxy.proxy.recorded
    streamed = {}
    for stream in (False, True):
        for path, make in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            request_id = rid()
            assert via.post(path, json=make(upstream.model, stream=stream), headers=headers(request_id)).status_code == 200
            streamed[request_id] = stream
    proxy.wait_recorded(before + len(streamed))
    proxy.flush()
    stored = rows(store, "px", list(streamed))
    assert {r: derived.known(row["ttft_seconds"]) for r, row in stored.items()} == streamed
    measured = [row["ttft_seconds"] for r, row in stored.items() if streamed[r]]
    assert all(t > 0 for t in measured)
    got = store.query_df(f"SELECT {derived.TTFT_QUANTILES_SQL} AS q FROM requests "
                         "WHERE replica_id = 'px' AND has({ids:Array(String)}, request_id)",
                         {"ids": list(streamed)})["q"][0]
    assert list(got) == pytest.approx(derived.quantiles(measured))


def test_what_the_client_asked_for_it_keeps(clients, upstream):
    """A client that asks for token IDs itself gets them, exactly as the upstream sends them."""
    direct, via = clients
    body = completion(upstream.model, return_token_ids=True)
    a = direct.post("/v1/completions", json=body).json()
    b = via.post("/v1/completions", json=body).json()
    assert without_volatile(b) == without_volatile(a)
    assert b["prompt_token_ids"] and b["choices"][0]["token_ids"]


def test_upstream_errors_pass_through_unchanged_and_each_is_a_row(clients, upstream, proxy, store):
    direct, via = clients
    before = proxy.proxy.recorded
    long_prompt = " ".join(["token"] * 600)  # past the upstream's 512-token context
    sent = {}
    for path, body, status, code in (
            ("/v1/completions", completion("no-such-model"), 404, "invalid_request"),
            ("/v1/chat/completions", chat(upstream.model, temperature=-1), 400, "invalid_request"),
            ("/v1/completions", completion(upstream.model, prompt=long_prompt), 400, "context_length")):
        a = direct.post(path, json=body)
        request_id = rid()
        b = via.post(path, json=body, headers=headers(request_id))
        assert b.status_code == a.status_code == status
        assert b.json() == a.json()
        sent[request_id] = (code, status)
    a = direct.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    request_id = rid()
    b = via.post("/v1/completions", content=b"{not json",
                 headers={"content-type": "application/json", "X-Request-Id": request_id})
    assert (b.status_code, b.json()) == (a.status_code, a.json())
    sent[request_id] = ("invalid_request", 400)
    assert proxy.proxy.recorded == before + len(sent)  # every request is a row, the refused ones too
    proxy.flush()
    stored = rows(store, "px", list(sent))
    assert set(stored) == set(sent)
    for request_id, (code, status) in sent.items():
        row = stored[request_id]
        assert (row["error_code"], row["http_status"], row["upstream_status"]) == (code, status, status), request_id
        assert row["upstream_error_body"] == ""  # it may quote the request: text, stored only with --store-text
    long_row = next(stored[i] for i, (code, _) in sent.items() if code == "context_length")
    limit = direct.get("/v1/models").json()["data"][0]["max_model_len"]
    assert long_row["prompt_tokens"] > limit and json.loads(long_row["error_detail_json"])["max_model_len"] == limit


def test_an_unreachable_upstream_is_a_502_row(sidecar, store, upstream):
    from engine.serving.proxy.background import BackgroundProxy

    request_id = rid()
    with BackgroundProxy.start("http://127.0.0.1:9", sidecar.store_url, "px-gone") as gone:
        r = httpx.post(gone.url + "/v1/completions", json=completion(upstream.model), headers=headers(request_id),
                       timeout=30)
        assert r.status_code == 502
        gone.flush()
    row = rows(store, "px-gone", [request_id])[request_id]
    assert (row["http_status"], row["upstream_status"], row["error_code"], row["workload"]) == \
        (502, 0, "upstream_error", "chat")


def test_other_paths_pass_through(clients):
    direct, via = clients
    assert via.get("/v1/models").json() == direct.get("/v1/models").json()
    # /health: the upstream's, as the replica the proxy's rows are stored under (loadgen groups by it)
    ours, theirs = via.get("/health"), direct.get("/health")
    assert ours.status_code == theirs.status_code == 200
    assert ours.json()["replica_id"] == "px" and ours.json()["upstream"] == str(direct.base_url).rstrip("/")
    assert set(ours.json()) == set(theirs.json()) | {"upstream"} and ours.json()["status"] == "ok"
    a = direct.post("/tokenize", json={"model": direct.get("/v1/models").json()["data"][0]["id"], "prompt": PROMPT})
    b = via.post("/tokenize", json={"model": via.get("/v1/models").json()["data"][0]["id"], "prompt": PROMPT})
    assert b.json() == a.json()


def test_an_extra_the_upstream_refuses_is_not_asked_for_again(clients, upstream, proxy):
    # infersight forbids unknown fields: a chat asked with return_prompt_text gets a 400 naming it, is
    # asked again without it, and answered
    assert clients[1].post("/v1/chat/completions", json=chat(upstream.model)).status_code == 200
    assert "return_prompt_text" in proxy.proxy.extras.refused
    assert "return_token_ids" not in proxy.proxy.extras.refused


def test_the_upstream_identity_row(proxy, store, upstream, tiny_llama):
    from engine.core.tokenization import Tokenizer

    proxy.flush()
    row = store.query_df("SELECT * FROM replicas WHERE replica_id = 'px'").to_dict("records")
    assert len(row) == 1
    tok = Tokenizer(tiny_llama)
    assert row[0]["model_name"] == upstream.model
    assert row[0]["engine_version"].startswith("infersight")
    assert (row[0]["tokenizer_hash"], row[0]["chat_template_hash"]) == (tok.tokenizer_hash, tok.chat_template_hash)
    assert json.loads(row[0]["config_json"])["model"] == str(tiny_llama)
