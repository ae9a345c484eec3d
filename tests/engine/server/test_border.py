"""The server/engine border, crossed once: a prompt is tokenized once per request (admission, through
the engine's tokenization cache), and the engine's record keeps what the request came as."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.contract.records import chat_messages_hash, text_sha256
from store_polling import stored_request


def tokenization_queries(live) -> float:
    """infersight_tokenization_cache_queries_total of the replica: the engine observer's on_tokenization calls."""
    for family in text_string_to_metric_families(httpx.get(live.url + "/metrics", timeout=10).text):
        if family.name == "infersight_tokenization_cache_queries":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no tokenization cache metric")


@pytest.fixture
def raw_encodes(live, monkeypatch):
    """Every encode that misses the cache (the tokenizer's own work), counted."""
    hf = live.served.tokenizer.hf
    calls = []
    real = hf.encode
    monkeypatch.setattr(hf, "encode", lambda *a, **k: calls.append(a[0] if a else k.get("text")) or real(*a, **k))
    return calls


def test_each_request_is_tokenized_once(client, live, raw_encodes):
    name = live.served.name
    unique = f"tokenized once {time.time_ns()}"
    cases = [  # (path, body, cache lookups, encodes by the tokenizer itself)
        ("/v1/completions", {"prompt": unique}, 1, 1),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": unique}]}, 1, 1),
        ("/v1/completions", {"prompt": [5, 6, 7, 8]}, 0, 0),  # token IDs: nothing to tokenize
        ("/v1/completions", {"prompt": unique, "stream": True}, 1, 0),  # the same text again: a cache hit
    ]
    for path, body, lookups, encodes in cases:
        before, encoded = tokenization_queries(live), len(raw_encodes)
        r = client.post(path, json={"model": name, "max_tokens": 2, "ignore_eos": True, **body})
        assert r.status_code == 200, r.text
        assert tokenization_queries(live) - before == lookups, (path, body)
        assert len(raw_encodes) - encoded == encodes, (path, body)


def test_records_keep_what_each_request_came_as(client, live, store):
    name = live.served.name
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "which hash am I?"}]
    chat = client.post("/v1/chat/completions", headers={"X-Request-Id": "border-chat"},
                       json={"model": name, "messages": messages, "max_tokens": 3, "return_token_ids": True})
    text = client.post("/v1/completions", headers={"X-Request-Id": "border-text"},
                       json={"model": name, "prompt": "which hash am I?", "max_tokens": 3})
    ids = client.post("/v1/completions", headers={"X-Request-Id": "border-ids"},
                      json={"model": name, "prompt": [5, 6, 7], "max_tokens": 3})
    assert chat.status_code == text.status_code == ids.status_code == 200
    live.flush()
    rendered = live.served.tokenizer.apply_chat_template(messages, tokenize=False)
    row = stored_request(store, "border-chat").iloc[0]
    assert row["prompt_text_hash"] == chat_messages_hash(messages) != ""
    assert row["rendered_prompt_hash"] == text_sha256(rendered)
    assert list(row["prompt_token_ids"]) == chat.json()["prompt_token_ids"]
    row = stored_request(store, "border-text").iloc[0]
    assert (row["prompt_text_hash"], row["rendered_prompt_hash"]) == (text_sha256("which hash am I?"), "")
    row = stored_request(store, "border-ids").iloc[0]
    assert (row["prompt_text_hash"], row["rendered_prompt_hash"]) == ("", "")
    # this replica was not allowed to store text: none stored, whatever the records carried
    texts = store.query_df("SELECT prompt_text, output_text FROM requests WHERE request_id LIKE 'border-%'")
    assert len(texts) == 3 and set(texts["prompt_text"]) == set(texts["output_text"]) == {""}
