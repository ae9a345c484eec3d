"""Shapes vLLM's clients and tools rely on, checked on infersight's server alone (tests/vllm_fleet/
test_api_like_vllm.py holds each beside the real vLLM's answer): /ping and /load, /detokenize keeping
special tokens, a completion's top_logprobs holding the token itself, and the fields of a stream's first
and last chunks."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROMPT = "The quick brown fox"


def model(client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def events(text: str) -> list[dict]:
    return [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def test_ping_answers_as_health_and_load_counts_the_requests_held(client, live):
    health = client.get("/health")
    for ping in (client.get("/ping"), client.post("/ping")):
        assert ping.status_code == health.status_code == 200
        assert ping.json()["status"] == "ok" and ping.json()["replica_id"] == health.json()["replica_id"]
    live.wait_idle()
    assert client.get("/load").json() == {"server_load": 0}
    # what it counts: the requests being admitted and those in the engine (an app over the same model,
    # its engine not started, its state set by hand: a live request is too quick to catch in flight)
    from fastapi.testclient import TestClient

    from engine.serving.server.app import build_app

    app = build_app(live.served, manage_engine=False)
    with TestClient(app) as local:
        app.state.server.in_flight["held"] = 0.0
        app.state.server.admitting = 2
        assert local.get("/load").json() == {"server_load": 3}


def test_detokenize_keeps_the_special_tokens_tokenize_gave(client, live):
    tok = live.served.tokenizer
    ids = client.post("/tokenize", json={"model": model(client), "prompt": PROMPT}).json()["tokens"]
    text = client.post("/detokenize", json={"model": model(client), "tokens": ids}).json()["prompt"]
    assert text == tok.decode(ids, skip_special_tokens=False)
    if tok.bos_token_id is not None and ids[0] == tok.bos_token_id:
        assert text.startswith(tok.hf.bos_token) and text != tok.decode(ids)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=st.integers(0, 3), echo=st.booleans(), seed=st.integers(0, 2**31))
def test_a_completions_top_logprobs_hold_the_token_itself(client, top, echo, seed):
    """Sampled (temperature 1.5: tokens outside the top-n come up), each entry starts with its own token
    and logprob, then the top-n, at most n + 1 entries (OpenAI's rule, vLLM's order)."""
    body = {"model": model(client), "prompt": PROMPT, "max_tokens": 4, "temperature": 1.5, "seed": seed,
            "logprobs": top, "echo": echo}
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["top_logprobs"])
    for token, value, entry in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        if value is None:  # the prompt's first token: nothing before it
            assert entry is None
            continue
        first = next(iter(entry.items()))
        assert first == (token, pytest.approx(value)) and len(entry) <= top + 1


@pytest.mark.parametrize("usage", [False, True])
def test_a_completion_streams_stop_reason_from_the_first_chunk_and_the_fingerprint_last(client, usage):
    body = {"model": model(client), "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    chunks = events(client.post("/v1/completions", json=body).text)
    whole = client.post("/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
    assert all("stop_reason" in c["choices"][0] for c in chunks if c["choices"])
    assert chunks[0]["choices"][0]["stop_reason"] is None
    assert chunks[-1]["system_fingerprint"] == whole["system_fingerprint"] is not None
    assert all("system_fingerprint" not in c for c in chunks[:-1])
    assert ("usage" in chunks[-1]) == usage


def test_a_chat_stream_ends_with_the_fingerprint(client):
    body = {"model": model(client), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, "stream": True}
    chunks = events(client.post("/v1/chat/completions", json=body).text)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None and chunks[-1]["system_fingerprint"].startswith("fp_")
    assert all("system_fingerprint" not in c for c in chunks[:-1])
