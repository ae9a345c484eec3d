"""The recording proxy in front of a real vLLM (the CPU build; the plain one the modules here share,
plain_vllm.py) on the reference model: the client gets what vLLM alone would give it, and every answered
request is stored with the token IDs vLLM used (vLLM's own answer with `return_token_ids` is the truth),
under the request id vLLM used."""

from __future__ import annotations

import json
import math
import uuid

import httpx
import pytest
from plain_vllm import SERVED
from vllm_fleet_marks import vllm_marks

from engine.core.model_refs import REFERENCE_MODEL

pytestmark = vllm_marks()

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, migrated_copy):
    from telemetry.sidecar.process import start_sidecar

    process = start_sidecar(migrated_copy(tmp_path_factory.mktemp("vllm-proxy-store")))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def vllm(plain_vllm):
    return plain_vllm


@pytest.fixture(scope="module")
def proxy(vllm, sidecar):
    from engine.serving.proxy.background import BackgroundProxy

    with BackgroundProxy.start(vllm.url, sidecar.store_url, "v0", model_dir=REFERENCE_MODEL) as p:
        yield p


@pytest.fixture(scope="module")
def store(sidecar):
    from telemetry.store import open_store

    s = open_store(sidecar.store_url)
    yield s
    s.close()


def _volatile_free(body):
    if isinstance(body, dict):
        return {k: _volatile_free(v) for k, v in body.items() if k not in ("id", "created")}
    return body


def _shape(value):
    """An event's keys (nested), with the values that tell fields apart by kind: which are null."""
    if isinstance(value, dict):
        return tuple((k, _shape(v)) for k, v in value.items() if k not in ("id", "created"))
    if isinstance(value, list):
        return tuple(_shape(v) for v in value)
    return value is None


def _streamed_text(events: list) -> str:
    return "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                   for e in events if e != "[DONE]" for ch in e["choices"])


def same_stream(proxied: list, plain: list) -> None:
    """Two streams of one greedy request: the same text and last event; and every event through the
    proxy shaped like one of vLLM's own (vLLM may send several tokens in one event when the reader
    lags, so the count of events differs from run to run)."""
    assert proxied[-1] == plain[-1] == "[DONE]"
    assert _streamed_text(proxied) == _streamed_text(plain)
    assert {_shape(e) for e in proxied[:-1]} <= {_shape(e) for e in plain[:-1]}
    assert _shape(proxied[0]) == _shape(plain[0])


def _events(text: str) -> list:
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: ")]


def _answer(client: httpx.Client, path: str, body: dict, request_id: str):
    r = client.post(path, json=body, headers={"X-Request-Id": request_id, "X-Workload": "chat"})
    assert r.status_code == 200, r.text
    return _events(r.text) if body.get("stream") else r.json()


CASES = [("/v1/completions", {"prompt": PROMPT, "max_tokens": 8}),
         ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8})]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path, shape", CASES, ids=["completion", "chat"])
def test_the_client_sees_what_vllm_says_and_the_row_holds_vllms_token_ids(vllm, proxy, store, path, shape, stream):
    body = {"model": SERVED, "temperature": 0, "ignore_eos": True, "stream": stream, **shape}
    before = proxy.proxy.recorded
    with httpx.Client(base_url=vllm.url, timeout=120) as direct, httpx.Client(base_url=proxy.url, timeout=120) as via:
        truth = _answer(direct, path, {**body, "return_token_ids": True}, uuid.uuid4().hex)
        plain = _answer(direct, path, body, uuid.uuid4().hex)
        request_id = uuid.uuid4().hex
        proxied = _answer(via, path, body, request_id)
    # what the client gets through the proxy: vLLM's own answer, field for field
    if stream:
        same_stream(proxied, plain)
    else:
        assert _volatile_free(proxied) == _volatile_free(plain)
    if stream:
        prompt_ids = next(c.get("prompt_token_ids") or c["choices"][0].get("prompt_token_ids") for c in truth
                          if c != "[DONE]" and (c.get("prompt_token_ids") or c["choices"][0].get("prompt_token_ids")))
        output_ids = [t for c in truth if c != "[DONE]" for ch in c["choices"] for t in ch.get("token_ids") or []]
        assert proxied[0]["id"].endswith(request_id)
    else:
        choice = truth["choices"][0]
        prompt_ids = truth.get("prompt_token_ids") or choice.get("prompt_token_ids")
        output_ids = choice["token_ids"]
        assert proxied["id"].endswith(request_id)  # vLLM used the proxy's id: cmpl-<id> / chatcmpl-<id>

    proxy.wait_recorded(before + 1)
    proxy.flush()
    row = store.query_df("SELECT * FROM requests WHERE request_id = {r:String}", {"r": request_id}).to_dict("records")
    assert len(row) == 1
    row = row[0]
    assert list(row["prompt_token_ids"]) == list(prompt_ids) and list(row["output_token_ids"]) == list(output_ids)
    assert row["output_tokens"] == len(output_ids) == 8
    assert "token_ids_source" not in json.loads(row["sampling_params_json"])  # vLLM's own IDs
    assert row["replica_id"] == "v0" and row["workload"] == "chat" and row["model_name"] == SERVED
    # the proxy's times: a stream's first token it saw; a whole response's it did not (unknown, never 0), nor
    # vLLM's queue and prefill (vLLM's plugin writes those to engine_request_timings)
    if stream:
        assert len(row["token_times"]) == 8 and row["ttft_seconds"] > 0
    else:
        assert list(row["token_times"]) == [] and math.isnan(row["ttft_seconds"]) and row["e2e_seconds"] > 0
    assert math.isnan(row["queue_seconds"]) and math.isnan(row["prefill_seconds"])
    if path.endswith("chat/completions"):  # vLLM returned the prompt its template rendered
        assert row["rendered_prompt_hash"] != ""


def test_vllm_tokenizes_like_infersight_on_the_reference_model(proxy, store):
    """The question a user asks: does our vLLM deployment tokenize like the reference?"""
    from engine.core.prompt import text_prompt
    from engine.core.tokenization import Tokenizer
    from telemetry.contract.records import text_sha256

    proxy.flush()
    rows = store.query_df("SELECT prompt_token_ids FROM requests WHERE replica_id = 'v0' "
                          "AND prompt_text_hash = {h:String}", {"h": text_sha256(PROMPT)})
    assert len(rows) >= 1
    expected = text_prompt(Tokenizer(REFERENCE_MODEL), PROMPT).token_ids
    assert all(list(ids) == expected for ids in rows["prompt_token_ids"])


def test_the_proxy_learned_vllms_ways(proxy):
    assert proxy.proxy.unasked == "null"  # vLLM writes unasked fields as null
    assert proxy.proxy.extras.refused == set()  # it takes return_token_ids and return_prompt_text
    assert proxy.proxy.info.engine_version.startswith("vllm-")


def test_the_proxy_pays_vllms_first_logprobs_request_at_start_and_does_not_record_it(proxy, store):
    """vLLM's first request asking for logprobs costs seconds, once (RecordingProxy._warm_logprobs has the
    numbers); the proxy asks one of its own as soon as vLLM answers, so no client's request pays it."""
    import time

    from engine.serving.proxy.app import WARMUP_REQUEST_PREFIX

    deadline = time.monotonic() + 60
    while proxy.proxy.logprobs_warmed is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proxy.proxy.logprobs_warmed is True
    proxy.flush()
    stored = store.query_df("SELECT count() AS n FROM requests WHERE startsWith(request_id, {p:String})",
                            {"p": WARMUP_REQUEST_PREFIX})
    assert int(stored["n"][0]) == 0


def test_promtool_maps_a_live_vllm_scrape_through_the_proxy(proxy, tmp_path):
    """vLLM's /metrics, read through the proxy (a replica's endpoint passes it through), mapped by the
    recording rules onto the infersight names, checked by promtool."""
    import shutil
    import subprocess

    import yaml

    from dashboards.vllm_mapping import MAPPINGS, promtool_test

    scrape = httpx.get(proxy.url + "/metrics", timeout=30).text
    assert "vllm:time_to_first_token_seconds_bucket" in scrape
    document, missing = promtool_test(scrape, {"job": "infersight-replicas", "replica": "v0"})
    assert set(missing) == {s for m in MAPPINGS if "spec_decode" in m.vllm for _, s in m.series()}
    path = tmp_path / "live_vllm_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    assert shutil.which("promtool"), "promtool is missing: run .ci/setup"
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vllms_refusals_are_rows_with_its_status_and_numbers(vllm, proxy, store):
    """vLLM's 400s pass through unchanged and are rows: a prompt past its context (the length and the limit
    read from its message) and an invalid parameter."""
    long_prompt = " ".join(["the cat sat"] * 120)  # ~490 tokens: past the reference model's 256
    sent = {uuid.uuid4().hex: ({"model": SERVED, "prompt": long_prompt, "max_tokens": 8}, "context_length"),
            uuid.uuid4().hex: ({"model": SERVED, "prompt": PROMPT, "max_tokens": 8, "temperature": -1},
                               "invalid_request")}
    before = proxy.proxy.recorded
    with httpx.Client(base_url=vllm.url, timeout=120) as direct, httpx.Client(base_url=proxy.url, timeout=120) as via:
        for request_id, (body, _) in sent.items():
            plain = direct.post("/v1/completions", json=body)
            proxied = via.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})
            assert proxied.status_code == plain.status_code == 400
            assert proxied.json()["error"]["message"] == plain.json()["error"]["message"]
    proxy.wait_recorded(before + len(sent))
    proxy.flush()
    rows = store.query_df("SELECT * FROM requests WHERE request_id IN {ids:Array(String)}",
                          {"ids": list(sent)}).set_index("request_id")
    assert sorted(rows.index) == sorted(sent)
    for request_id, (_, code) in sent.items():
        assert (rows.loc[request_id, "error_code"], rows.loc[request_id, "upstream_status"]) == (code, 400)
    long_row = rows.loc[next(i for i, (_, c) in sent.items() if c == "context_length")]
    detail = json.loads(long_row["error_detail_json"])
    assert detail["max_model_len"] == 256 and long_row["prompt_tokens"] > 256


def test_a_rescore_request_stores_vllms_prompt_logprobs(vllm, proxy, store):
    """The continuous cross-scorer's request (engine/traffic/probe/rescore.py: prompt + output token IDs,
    teacher-forced, prompt_logprobs 0) through the proxy: the row holds the prompt tokens' own logprobs
    after the first, the ones vLLM answered, so a vLLM replica scores its peers' requests."""
    from engine.core.prompt import text_prompt
    from engine.core.tokenization import Tokenizer

    ids = text_prompt(Tokenizer(REFERENCE_MODEL), PROMPT + " jumps over the lazy dog").token_ids
    body = {"model": SERVED, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    before = proxy.proxy.recorded
    request_id = uuid.uuid4().hex
    with httpx.Client(base_url=proxy.url, timeout=120) as via:
        answer = via.post("/v1/completions", json=body, headers={"X-Request-Id": request_id,
                                                                   "X-Workload": "rescore"}).json()
    entries = answer["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    expected = [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], ids[1:])]
    proxy.wait_recorded(before + 1)
    proxy.flush()
    row = store.query_df("SELECT * FROM requests WHERE request_id = {r:String}", {"r": request_id}).to_dict("records")
    assert len(row) == 1 and list(row[0]["prompt_token_ids"]) == ids
    assert list(row[0]["prompt_logprobs"]) == pytest.approx(expected, abs=1e-6)
    assert all(lp <= 0 for lp in expected)
