"""response_format over real HTTP on the shipped reference model: json_object and json_schema on
/v1/chat/completions (and /v1/completions), streamed and not, n > 1, greedy and sampled; a bad schema is a
400 naming response_format; the store row's sampling params carry the format as the client sent it."""

from __future__ import annotations

import json
import uuid

import httpx
import jsonschema
import pytest
from store_polling import stored_request
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "color"]}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
MESSAGES = [{"role": "user", "content": "add 12 and 30"}]


@pytest.fixture(scope="module")
def ref():
    """The reference model served without telemetry: (client, served model name)."""
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    torch.set_num_threads(1)
    engine = AsyncLLM(EngineConfig(model=str(REFERENCE), num_kv_blocks=64, max_num_seqs=8, replica_id="so-api"))
    served = ServedModel.from_engine(engine, created=0)
    with BackgroundServer(build_app(served)) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        yield c, served.name


def _chat(ref, **body):
    client, model = ref
    return client.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 100,
                                                     "temperature": 0, **body})


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _chunks(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def test_json_schema_greedy_sampled_and_n(ref):
    plain = _chat(ref)
    assert plain.status_code == 200 and not _valid(plain.json()["choices"][0]["message"]["content"])
    greedy = _chat(ref, response_format=SCHEMA_FORMAT)
    assert greedy.status_code == 200, greedy.text
    choice = greedy.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and _valid(choice["message"]["content"]), choice
    sampled = _chat(ref, response_format=SCHEMA_FORMAT, temperature=1.0, seed=7, n=3)
    assert sampled.status_code == 200, sampled.text
    choices = sampled.json()["choices"]
    assert len(choices) == 3 and all(_valid(c["message"]["content"]) for c in choices), choices
    assert len({c["message"]["content"] for c in choices}) > 1  # three samples, not one copied


def test_json_object_and_streaming(ref):
    r = _chat(ref, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)
    streamed = _chat(ref, response_format=SCHEMA_FORMAT, stream=True)
    assert streamed.status_code == 200
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in _chunks(streamed.text) if c["choices"])
    assert _valid(text) and text == _chat(ref, response_format=SCHEMA_FORMAT).json()["choices"][0]["message"]["content"]


def test_completions_take_response_format_too(ref):
    client, model = ref
    r = client.post("/v1/completions", json={"model": model, "prompt": "add 12 and 30", "max_tokens": 100,
                                             "temperature": 0, "response_format": SCHEMA_FORMAT})
    assert r.status_code == 200, r.text
    assert _valid(r.json()["choices"][0]["text"])


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}, "cannot compile"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}, "cannot compile"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "xml"}, "response_format"),
])
def test_bad_formats_are_400s_with_a_message(ref, fmt, words):
    r = _chat(ref, response_format=fmt)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("response_format") and words in error["message"], error


def test_the_store_row_carries_the_format(client, live, store):
    rid = f"so-{uuid.uuid4().hex[:8]}"
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {
        "k": {"enum": ["a", "b"]}}, "required": ["k"]}}}
    r = client.post("/v1/chat/completions", headers={"X-Request-Id": rid}, json={
        "model": live.served.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
        "temperature": 0, "response_format": fmt})
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) in ({"k": "a"}, {"k": "b"})
    live.flush()
    row = stored_request(store, rid)
    assert json.loads(row.iloc[0]["sampling_params_json"])["response_format"] == fmt
