"""The OpenAI-compatible API of one replica, over real HTTP: shapes, streaming, extras, errors."""

from __future__ import annotations

import json

import httpx
import pytest

MAX_MODEL_LEN = 1024  # the `live` fixture's engine (checked in test_models_and_health)


def sse_chunks(text: str) -> list:
    """The data payloads of an SSE body (JSON decoded, '[DONE]' kept as is)."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def model(live) -> str:
    return live.served.name


def test_models_and_health(client, live):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == model(live)
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["replica_id"] == "api-test"
    assert health["kv_blocks_total"] == 80


def test_tokenize(client, live):
    tok = live.served.tokenizer
    r = client.post("/tokenize", json={"model": model(live), "prompt": "count me"}).json()
    assert r == {"count": len(tok.encode("count me")), "max_model_len": MAX_MODEL_LEN, "tokens": tok.encode("count me")}
    messages = [{"role": "user", "content": "hi"}]
    r = client.post("/tokenize", json={"model": model(live), "messages": messages}).json()
    assert r["tokens"] == tok.apply_chat_template(messages)
    for body in [{"model": model(live)}, {"model": model(live), "prompt": "x", "messages": messages}]:
        assert client.post("/tokenize", json=body).status_code == 400
    assert client.post("/tokenize", json={"model": "other", "prompt": "x"}).status_code == 404  # as vLLM


def test_completion_with_token_ids_and_timings(client, live):
    r = client.post("/v1/completions", json={
        "model": model(live), "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, "return_metrics": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    tok = live.served.tokenizer
    assert body["object"] == "text_completion"
    assert body["prompt_token_ids"] == tok.encode("The quick brown fox")
    assert len(choice["token_ids"]) == 12 == body["usage"]["completion_tokens"]
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert choice["text"] == tok.decode(choice["token_ids"])
    assert choice["finish_reason"] == "length"
    m = body["metrics"]
    assert 0 <= m["queue_seconds"] <= m["ttft_seconds"] <= m["e2e_seconds"]
    assert m["arrival_time"] <= m["scheduled_time"] <= m["first_token_time"] <= m["finish_time"]
    assert m["mean_itl_seconds"] > 0
    # without the extras, the plain OpenAI shape
    plain = client.post("/v1/completions", json={"model": model(live), "prompt": "hi", "max_tokens": 2}).json()
    assert "metrics" not in plain and "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_stream_equals_non_stream(client, live):
    req = {"model": model(live), "prompt": [5, 6, 7, 8, 9], "max_tokens": 10, "temperature": 0,
           "ignore_eos": True, "return_token_ids": True, "return_metrics": True}
    full = client.post("/v1/completions", json=req).json()
    r = client.post("/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(r.text)
    assert chunks[-1] == "[DONE]"
    events = chunks[:-1]
    assert events[0]["prompt_token_ids"] == [5, 6, 7, 8, 9]
    tokens = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert tokens == full["choices"][0]["token_ids"]
    assert text == full["choices"][0]["text"]
    finals = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert finals[0]["metrics"]["ttft_seconds"] > 0
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 10


def test_chat_stream_and_full(client, live):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    req = {"model": model(live), "messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
           "return_token_ids": True}
    full = client.post("/v1/chat/completions", json=req).json()
    assert full["object"] == "chat.completion"
    assert full["choices"][0]["message"]["role"] == "assistant"
    assert full["prompt_token_ids"] == live.served.tokenizer.apply_chat_template(messages)
    chunks = sse_chunks(client.post("/v1/chat/completions", json={**req, "stream": True}).text)
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert content == full["choices"][0]["message"]["content"]
    tokens = [t for c in chunks[1:-1] for t in c["choices"][0].get("token_ids", [])]
    assert tokens == full["choices"][0]["token_ids"]


def test_logprobs(client, live):
    r = client.post("/v1/completions", json={"model": model(live), "prompt": "abc", "max_tokens": 4,
                                             "logprobs": 2, "ignore_eos": True}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert all(x <= 0 for x in lp["token_logprobs"])
    # the token itself, then the top 2 (up to 3 entries: OpenAI's logprobs + 1, as vLLM writes them)
    assert all(1 <= len(top) <= 3 and next(iter(top)) == token for top, token in zip(lp["top_logprobs"], lp["tokens"]))
    chat = client.post("/v1/chat/completions", json={
        "model": model(live), "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "ignore_eos": True,
        "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)


def test_seed_reproduces_sampling(client, live):
    req = {"model": model(live), "prompt": "seed test", "max_tokens": 8, "temperature": 1.0, "seed": 1234,
           "ignore_eos": True, "return_token_ids": True}
    a = client.post("/v1/completions", json=req).json()["choices"][0]["token_ids"]
    b = client.post("/v1/completions", json=req).json()["choices"][0]["token_ids"]
    assert a == b


def test_stop_string_is_honoured(client, live):
    # find what greedy decoding says, then stop on a piece of it
    req = {"model": model(live), "prompt": "stop test", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    text = client.post("/v1/completions", json=req).json()["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("greedy output has no usable stop string")
    stopped = client.post("/v1/completions", json={**req, "stop": [stop]}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stop not in stopped["text"] and text.startswith(stopped["text"])


def test_request_id_is_echoed_or_made(client, live):
    r = client.post("/v1/completions", json={"model": model(live), "prompt": "x", "max_tokens": 1},
                    headers={"X-Request-Id": "my-req-42"})
    assert r.headers["x-request-id"] == "my-req-42"
    assert r.json()["id"] == "cmpl-my-req-42"
    r = client.post("/v1/completions", json={"model": model(live), "prompt": "x", "max_tokens": 1})
    assert len(r.headers["x-request-id"]) == 32
    # errors carry it too
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"}, headers={"X-Request-Id": "bad-1"})
    assert r.status_code == 404 and r.headers["x-request-id"] == "bad-1"


BAD_REQUESTS = [
    ("malformed JSON", b'{"model": "m", "prompt": ', "invalid_json", "not valid JSON"),
    ("not an object", b"[1, 2]", None, "must be a JSON object"),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -1}, None, "max_tokens"),
    ("huge max_tokens", {"prompt": "x", "max_tokens": 10**12}, "context_length_exceeded", "maximum context length"),
    ("prompt too long", {"prompt": [10] * MAX_MODEL_LEN}, "context_length_exceeded", "prompt is"),
    ("token id outside the vocabulary", {"prompt": [1, 2, 999999]}, "invalid_token_id", "outside the vocabulary"),
    ("negative token id", {"prompt": [1, -2]}, None, "prompt"),
    ("temperature out of range", {"prompt": "x", "temperature": -0.5}, None, "temperature"),
    ("top_p out of range", {"prompt": "x", "top_p": 0}, None, "top_p"),
    ("top_k out of range", {"prompt": "x", "top_k": -7}, None, "top_k"),
    ("logprobs out of range", {"prompt": "x", "logprobs": 99}, None, "logprobs"),
    ("best_of < n", {"prompt": "x", "n": 2, "best_of": 1}, None, "at least n"),
    ("best_of streamed", {"prompt": "x", "best_of": 4, "stream": True}, None, "cannot be streamed"),
    ("unknown option", {"prompt": "x", "frobnicate": True}, "unsupported_parameter", "frobnicate"),
    ("wrong type", {"prompt": "x", "max_tokens": "many"}, None, "max_tokens"),
    ("missing prompt", {}, "missing_parameter", "prompt"),
]


@pytest.mark.parametrize("name, body, code, words", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_is_a_400_and_the_server_keeps_serving(client, live, name, body, code, words):
    if isinstance(body, dict):
        body = json.dumps({"model": model(live), **body}).encode()
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert words in error["message"]
    if code:
        assert error["code"] == code
    ok = client.post("/v1/completions", json={"model": model(live), "prompt": "still here", "max_tokens": 2})
    assert ok.status_code == 200


def test_wrong_content_type_and_oversized_body(client, live):
    r = client.post("/v1/completions", content=b"model=m&prompt=x",
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"
    # no content type at all (a bare `curl --data-binary`): read as JSON
    body = json.dumps({"model": model(live), "prompt": "x", "max_tokens": 1}).encode()
    assert client.post("/v1/completions", content=body, headers={"content-type": ""}).status_code == 200
    r = client.post("/v1/completions", content=b"[" + b"1," * (17 << 20) + b"1]",
                    headers={"content-type": "application/json", "X-Request-Id": "huge-1"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert r.headers["x-request-id"] == "huge-1"


def test_bad_chat_input(client, live):
    for body, words in [({"messages": []}, "messages"), ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
                        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, "context length"),
                        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tool")]:
        r = client.post("/v1/chat/completions", json={"model": model(live), **body})
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_duplicate_request_id_in_flight_is_refused(live):
    req = {"model": model(live), "prompt": "long one", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=live.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=req, headers={"X-Request-Id": "dup-1"}) as first:
            lines = first.iter_lines()  # (kept: closing this iterator would close the connection)
            next(lines)  # it is running (1000 tokens take a while)
            second = c.post("/v1/completions", json={**req, "stream": False}, headers={"X-Request-Id": "dup-1"})
            assert second.status_code == 409, second.text
            assert second.json()["error"]["code"] == "duplicate_request_id"
    live.wait_idle()


def test_metrics_endpoint(client, live):
    from prometheus_client.parser import text_string_to_metric_families

    client.post("/v1/completions", json={"model": model(live), "prompt": "m", "max_tokens": 2})
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert "infersight_time_to_first_token_seconds" in families
    success = families["infersight_request_success"]  # the parser drops _total from counter names
    assert sum(s.value for s in success.samples if s.name.endswith("_total")) >= 1
