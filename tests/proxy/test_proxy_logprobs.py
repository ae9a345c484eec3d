"""The proxy asks the upstream for the sampled tokens' logprobs (where the client did not), stores
them as output_logprobs, and the client receives exactly what it would have without the proxy.

infersight's own server is the upstream; its own row of each request (replica `up`, the engine's
raw logprobs) is the truth the proxy's row (`px`) is held to.
"""

from __future__ import annotations

import json
import uuid

import pytest
from proxy_support import rows, sse_payloads, without_volatile

from engine.serving.proxy.extras import UpstreamExtras

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]


def completion(model: str, **extra) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0.9, "seed": 3, "ignore_eos": True,
            **extra}


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0.9, "seed": 3, "ignore_eos": True,
            **extra}


def test_what_is_asked_and_when():
    extras = UpstreamExtras()
    sent, added = extras.ask({"prompt": "x"}, "completion")
    assert sent["logprobs"] == 0 and "logprobs" in added
    sent, added = extras.ask({"messages": []}, "chat")
    assert sent["logprobs"] is True and sent["top_logprobs"] == 0 and "logprobs" in added
    for body, kind in (({"prompt": "x", "logprobs": 0}, "completion"), ({"prompt": "x", "logprobs": 2}, "completion"),
                       ({"messages": [], "logprobs": True}, "chat")):
        sent, added = extras.ask(body, kind)
        assert "logprobs" not in added and sent["logprobs"] == body["logprobs"]  # the client's own, untouched


def test_no_logprobs_setting_asks_for_token_ids_only():
    import argparse

    from engine.serving.proxy.cli import add_arguments, build_proxy

    sent, added = UpstreamExtras(0.0).ask({"prompt": "x"}, "completion")
    assert "logprobs" not in sent and added == {"return_token_ids"}
    sent, added = UpstreamExtras(0.0).ask({"prompt": "x", "logprobs": 1}, "completion")
    assert sent["logprobs"] == 1 and "logprobs" not in added  # the client's own ask passes as it was
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag, asked in (("--logprobs", True), ("--no-logprobs", False)):
        _, parts, proxy = build_proxy(parser.parse_args(["--upstream", "http://127.0.0.1:9", flag]))
        try:
            assert ("logprobs" in proxy.extras.ask({"prompt": "x"}, "completion")[1]) is asked
        finally:
            parts.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path, make", [("/v1/completions", completion), ("/v1/chat/completions", chat)],
                         ids=["completions", "chat"])
def test_logprobs_are_stored_and_not_shown(clients, upstream, proxy, store, path, make, stream):
    direct, via = clients
    body = make(upstream.model, stream=stream)
    before = proxy.proxy.recorded
    a = direct.post(path, json=body, headers={"X-Request-Id": uuid.uuid4().hex})
    request_id = uuid.uuid4().hex
    b = via.post(path, json=body, headers={"X-Request-Id": request_id})
    assert a.status_code == b.status_code == 200
    if stream:
        ours, theirs = sse_payloads(b.text), sse_payloads(a.text)
        assert len(ours) == len(theirs) > 2
        for x, y in zip(ours, theirs):  # seeded: the same tokens, and no logprobs the client did not ask for
            assert (x if x == "[DONE]" else without_volatile(x)) == (y if y == "[DONE]" else without_volatile(y))
    else:
        assert without_volatile(b.json()) == without_volatile(a.json())
        assert b.json()["choices"][0]["logprobs"] is None
    assert "logprobs" not in proxy.proxy.extras.refused

    proxy.wait_recorded(before + 1)
    upstream.flush()
    proxy.flush()
    t, m = rows(store, "up", [request_id])[request_id], rows(store, "px", [request_id])[request_id]
    assert len(m["output_logprobs"]) == len(m["output_token_ids"]) == body["max_tokens"]
    assert list(m["output_logprobs"]) == pytest.approx(list(t["output_logprobs"]), abs=1e-5)
    assert all(lp <= 0 for lp in m["output_logprobs"])
    assert json.loads(m["sampling_params_json"])["logprobs"] is None  # the client's parameters, not the proxy's


def test_only_a_vllm_upstream_gets_the_logprobs_warm_up(clients, proxy):
    """The warm-up pays a cost of vLLM's (RecordingProxy._warm_logprobs); another upstream is not sent it."""
    import time

    _, via = clients
    assert via.get("/v1/models").status_code == 200
    deadline = time.monotonic() + 30
    while proxy.proxy.info is None and time.monotonic() < deadline:  # the proxy learns it in the background
        time.sleep(0.05)
    assert proxy.proxy.info is not None and proxy.proxy.info.owned_by != "vllm"
    assert proxy.proxy.extras.logprobs_fraction > 0 and proxy.proxy.logprobs_warmed is None


def test_a_client_that_asks_for_logprobs_keeps_them(clients, upstream):
    direct, via = clients
    body = completion(upstream.model, logprobs=2)
    a = direct.post("/v1/completions", json=body).json()
    b = via.post("/v1/completions", json=body).json()
    assert without_volatile(b) == without_volatile(a)
    assert len(b["choices"][0]["logprobs"]["token_logprobs"]) == body["max_tokens"]
