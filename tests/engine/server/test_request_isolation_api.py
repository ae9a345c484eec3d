"""One request can never fail another, on a running replica of the reference model.

Eight greedy streams run while every numeric field of /v1/completions and /v1/chat/completions is sent its
extremes (inf, NaN, 2**63, 2**64, 1e308, -1, 0, huge negatives) and the wrong types (strings, null, bools,
lists, objects), all at once: each value the field's range admits is served (200), every other one is a
4xx whose `param` names the field, every healthy stream ends with exactly the text it gives alone, and the
engine holds no request and no KV block afterwards (/metrics agrees). The ranges are stated here, apart
from the code (OpenAI's and vLLM's bounds, the sampler's int64, the served vocabulary and context).

And a request that fails inside the engine, mid-generation, beside healthy streams fails alone: a 500 (or
an in-band error event when streamed), its stored record marked finish reason "error" with the reason.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.model_refs import REFERENCE_MODEL
from tests.engine.server.metrics_scrape import scraped_metric
from tests.engine.server.store_polling import stored_request

REPLICA_ID = "isolation-test"
HEALTHY_PROMPTS = ["The capital of France is", "1 2 3 4 5", "Once upon a time", "Q: What is 2 + 2?\nA:",
                   "def add(a, b):", "Paris, London,", "The quick brown fox", "Hello, my name is"]
HEALTHY_TOKENS = 96
INT64_MAX = 2**63 - 1
SEED_MAX = 2**53 - 1  # the API's seed: the integers every JSON parser keeps exactly


@pytest.fixture(scope="module")
def replica(sidecar_url):
    """The reference model served as `infersight serve` serves it: metrics, and records into the sidecar."""
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel
    from telemetry.replica_wiring import build_observer

    torch.set_num_threads(1)
    # room for the healthy streams and the cases in one batch (the cases run beside them, not after)
    config = EngineConfig(model=str(REFERENCE_MODEL), num_kv_blocks=256, block_size=16, max_num_seqs=16,
                          replica_id=REPLICA_ID)
    observer, parts = build_observer(REPLICA_ID, Path(REFERENCE_MODEL).name, store_target=sidecar_url)
    served = ServedModel.from_engine(AsyncLLM(config, observer), created=int(time.time()))
    app = build_app(served, metrics_registry=parts.registry, metrics_observer=parts.metrics)
    with BackgroundServer(app) as server:
        yield server.url, served, parts
    parts.close()


ENDPOINT_NAMES = ("/v1/completions", "/v1/chat/completions")


def _prompt_of(endpoint: str) -> dict:
    if endpoint == "/v1/completions":
        return {"prompt": "hello"}
    return {"messages": [{"role": "user", "content": "hello"}]}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _integral(v) -> bool:  # JSON Schema's integers: 5 and 5.0
    return _int(v) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())


def _real(v) -> bool:  # a finite float, or an integer that is one (10**400 is none)
    return (_int(v) and abs(v) <= sys.float_info.max) or (isinstance(v, float) and math.isfinite(v))


def _in(v, low, high) -> bool:
    return low <= v <= high


def _optional(check):
    return lambda v: v is None or check(v)


def _token(vocab: int):
    return lambda v: _integral(v) and _in(v, 0, vocab - 1)


def _prompt(vocab: int):
    """A completions prompt of one item: a token ID, or (a list of prompts) a text or a list of token IDs."""
    token = _token(vocab)
    return lambda v: token(v) or (isinstance(v, str) and v != "") or (
        isinstance(v, list) and bool(v) and all(token(t) for t in v))


def valid_values(vocab: int, room: dict[str, int]) -> dict[str, dict]:
    """endpoint -> field -> whether a value is valid there (the field's first word is the request's field, the
    `param` of its 400). `room`: the tokens that fit beside the prompt."""
    common = {
        "temperature": lambda v: _real(v) and _in(v, 0, 100),
        "top_p": lambda v: _real(v) and 0 < v <= 1,
        "top_k": lambda v: _integral(v) and (v == -1 or _in(v, 1, INT64_MAX)),
        "seed": _optional(lambda v: _integral(v) and _in(v, 0, SEED_MAX)),
        "n": lambda v: _integral(v) and _in(v, 1, 64),
        "presence_penalty": lambda v: _real(v) and _in(v, -2, 2),
        "frequency_penalty": lambda v: _real(v) and _in(v, -2, 2),
        "repetition_penalty": lambda v: _real(v) and v > 0,
        "min_p": lambda v: _real(v) and _in(v, 0, 1),
        "logit_bias": lambda v: _real(v) and _in(v, -100, 100),  # the bias of token 5
        # the key str(value): a token ID written in decimal, as JSON writes an integer (no sign, no leading 0)
        "logit_bias key": lambda v: re.fullmatch("0|[1-9][0-9]*", str(v)) is not None and int(str(v)) < vocab,
        "stop_token_ids": _token(vocab),  # a list of this one token ID
    }
    completion = {
        **common,
        "max_tokens": _optional(lambda v: _integral(v) and _in(v, 1, room["/v1/completions"])),
        "logprobs": _optional(lambda v: _integral(v) and _in(v, 0, 20)),
        "prompt_logprobs": _optional(lambda v: _integral(v) and _in(v, 0, 20)),
        "best_of": _optional(lambda v: _integral(v) and _in(v, 1, 64)),  # at least n (1)
        "prompt": _prompt(vocab),  # a list of this one item
    }
    fits_chat = _optional(lambda v: _integral(v) and _in(v, 1, room["/v1/chat/completions"]))
    chat = {**common, "max_tokens": fits_chat, "max_completion_tokens": fits_chat,
            "top_logprobs": _optional(lambda v: _integral(v) and _in(v, 0, 20))}
    return {"/v1/completions": completion, "/v1/chat/completions": chat}


@pytest.fixture(scope="module")
def fields(replica) -> dict[str, dict]:
    url, served, _ = replica
    counts = {endpoint: httpx.post(url + "/tokenize", json={"model": served.name, **_prompt_of(endpoint)},
                                   timeout=30).json()["count"] for endpoint in ENDPOINT_NAMES}
    return valid_values(served.vocab_size, {e: served.max_model_len - n for e, n in counts.items()})


EXTREMES = [math.inf, -math.inf, math.nan, 2**63, 2**63 - 1, 2**64, 1e308, -1e308, -1, 0, -(2**63) - 1,
            -(2**64), 10**30, 10**400, 1e-320, 0.5, "1", None, True, [1], {}]


def _body(endpoint: str, model: str, field: str, value) -> dict:
    body = {"model": model, "max_tokens": 4, **_prompt_of(endpoint)}
    if field == "logit_bias":
        body["logit_bias"] = {"5": value}
    elif field == "logit_bias key":
        body["logit_bias"] = {str(value): 1.0}
    elif field in ("stop_token_ids", "prompt"):
        body[field] = [value]
    elif field == "max_completion_tokens":
        del body["max_tokens"]
        body[field] = value
    else:
        body[field] = value
        if field == "top_logprobs":
            body["logprobs"] = True
    return body


def _cases(fields: dict, model: str, values, endpoints=ENDPOINT_NAMES) -> list[tuple[str, str, object, dict]]:
    return [(endpoint, field, value, _body(endpoint, model, field, value))
            for endpoint in endpoints for field in fields[endpoint] for value in values]


def _healthy_body(model: str, prompt: str) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": HEALTHY_TOKENS, "temperature": 0, "ignore_eos": True}


async def _stream_text(client: httpx.AsyncClient, body: dict, started: asyncio.Event | None = None) -> dict:
    """A streamed completion: its text, finish reason and any in-band error."""
    text, finish, errors = "", None, []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                errors.append(chunk["error"]["message"])
                continue
            if started is not None:
                started.set()
            choice = chunk["choices"][0]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
    return {"text": text, "finish_reason": finish, "errors": errors}


@pytest.fixture(scope="module")
def alone(replica):
    """Each healthy request's text when it runs by itself."""
    url, served, _ = replica
    with httpx.Client(base_url=url, timeout=120) as client:
        texts = []
        for prompt in HEALTHY_PROMPTS:
            r = client.post("/v1/completions", json=_healthy_body(served.name, prompt))
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
    return texts


async def _storm(url: str, model: str, cases, healthy_prompts) -> tuple[list[dict], list[httpx.Response]]:
    """The healthy streams, and once each has its first token, every case at once (16 in flight)."""
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        started = [asyncio.Event() for _ in healthy_prompts]
        healthy = [asyncio.ensure_future(_stream_text(client, _healthy_body(model, p), e))
                   for p, e in zip(healthy_prompts, started)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
        gate = asyncio.Semaphore(16)

        async def send(body):
            async with gate:
                return await client.post(body_path(body), content=json.dumps(body),
                                         headers={"Content-Type": "application/json"})

        responses = await asyncio.gather(*(send(body) for _, _, _, body in cases))
        return await asyncio.gather(*healthy), responses


def body_path(body: dict) -> str:
    return "/v1/completions" if "prompt" in body else "/v1/chat/completions"


def _check(fields: dict, cases, responses) -> None:
    for (endpoint, field, value, body), r in zip(cases, responses):
        valid = fields[endpoint][field](value)
        where = f"{endpoint} {field}={value!r}: {r.status_code} {r.text[:300]}"
        if valid:
            assert r.status_code == 200, where
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length"), where
        else:
            assert 400 <= r.status_code < 500, where
            assert r.json()["error"]["param"] == field.split(" ")[0], where


def _assert_idle(replica) -> None:
    url, served, _ = replica
    deadline = time.monotonic() + 60
    while True:
        h = httpx.get(url + "/health", timeout=10).json()
        idle = (h["running"], h["waiting"], h["kv_blocks_used"], h["in_flight"]) == (0, 0, 0, 0)
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert idle, h
    labels = {"replica": REPLICA_ID}
    assert scraped_metric(url, "infersight_kv_cache_blocks", state="used", **labels) == 0
    assert scraped_metric(url, "infersight_kv_cache_usage_ratio", **labels) == 0.0
    assert served.engine.is_running and h["status"] == "ok"


def test_every_numeric_extreme_beside_healthy_streams(replica, fields, alone):
    url, served, _ = replica
    cases = _cases(fields, served.name, EXTREMES)
    healthy, responses = asyncio.run(_storm(url, served.name, cases, HEALTHY_PROMPTS))
    _check(fields, cases, responses)
    for i, out in enumerate(healthy):
        assert out == {"text": alone[i], "finish_reason": "length", "errors": []}, f"healthy stream {i}"
    _assert_idle(replica)


NUMBERS = st.one_of(st.integers(-(2**80), 2**80), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(EXTREMES))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(ENDPOINT_NAMES), values=st.lists(NUMBERS, min_size=4, max_size=10))
def test_generated_numbers_beside_healthy_streams(replica, fields, alone, endpoint, values):
    """Numbers hypothesis makes up, for every field of an endpoint, beside four healthy streams."""
    url, served, _ = replica
    cases = _cases(fields, served.name, values, [endpoint])
    healthy, responses = asyncio.run(_storm(url, served.name, cases, HEALTHY_PROMPTS[:4]))
    _check(fields, cases, responses)
    for i, out in enumerate(healthy):
        assert out == {"text": alone[i], "finish_reason": "length", "errors": []}, f"healthy stream {i}"
    _assert_idle(replica)


def test_a_request_failing_inside_the_engine_fails_alone(replica, alone, store, monkeypatch):
    """Its detokenization raises mid-generation (the tokenizer failing on its tokens, as a broken tokenizer
    would): that request alone ends, with a 500 (in-band when streamed) and its record marked error."""
    url, served, parts = replica
    engine = served.engine.engine
    make_sequence = engine.make_sequence

    def failing_for_some(request_id, *args, **kwargs):
        seq = make_sequence(request_id, *args, **kwargs)
        if request_id.startswith("fails-inside"):
            decode, calls = seq.detokenizer.decode, []

            def decode_then_fail(ids):
                calls.append(1)
                if len(calls) > 12:  # some tokens in: the request fails while the others run
                    raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "the tokenizer failed on this request")
                return decode(ids)
            seq.detokenizer.decode = decode_then_fail
        return seq

    monkeypatch.setattr(engine, "make_sequence", failing_for_some)

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            started = [asyncio.Event() for _ in HEALTHY_PROMPTS]
            healthy = [asyncio.ensure_future(_stream_text(client, _healthy_body(served.name, p), e))
                       for p, e in zip(HEALTHY_PROMPTS, started)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            body = _healthy_body(served.name, "1 2 1 2 1 2")
            full = asyncio.ensure_future(client.post("/v1/completions", json=body,
                                                     headers={"X-Request-Id": "fails-inside-full"}))
            streamed = client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                     headers={"X-Request-Id": "fails-inside-stream"})
            async with streamed as s:
                events = [line async for line in s.aiter_lines() if line.startswith("data: ")]
            return await asyncio.gather(*healthy), await full, events

    healthy, full, events = asyncio.run(run())
    assert full.status_code == 500, full.text
    assert "UnicodeDecodeError" in full.json()["error"]["message"]
    errors = [json.loads(e[6:])["error"]["message"] for e in events if e != "data: [DONE]" and '"error"' in e]
    assert len(errors) == 1 and "UnicodeDecodeError" in errors[0] and events[-1] == "data: [DONE]", events
    for i, out in enumerate(healthy):
        assert out == {"text": alone[i], "finish_reason": "length", "errors": []}, f"healthy stream {i}"
    _assert_idle(replica)
    parts.recorder.flush()
    for request_id in ("fails-inside-full", "fails-inside-stream"):
        row = stored_request(store, request_id)
        assert len(row) == 1, request_id
        assert row["finish_reason"][0] == "error" and "UnicodeDecodeError" in row["error"][0], row.iloc[0].to_dict()
