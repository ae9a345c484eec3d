"""Where the upstream gives no token IDs the proxy's tokenizer makes them, and says so; a store that
is down never costs the client an answer, and what was recorded meanwhile arrives once it is back."""

from __future__ import annotations

import json
import socket
import uuid

import httpx
from proxy_support import rows

from engine.serving.proxy.background import BackgroundProxy

PROMPT = "Tokens the proxy must make itself"


def test_without_upstream_token_ids_the_proxys_tokenizer_makes_them_and_marks_them(upstream, sidecar, store,
                                                                                   tiny_llama):
    with BackgroundProxy.start(upstream.url, sidecar.store_url, "px-tok", model_dir=tiny_llama) as p:
        p.proxy.extras.refused.add("return_token_ids")  # as an upstream that knows no such option
        ids = [uuid.uuid4().hex for _ in range(2)]
        with httpx.Client(base_url=p.url, timeout=60) as client:
            for request_id, stream in zip(ids, (False, True)):
                r = client.post("/v1/completions", headers={"X-Request-Id": request_id},
                                json={"model": upstream.model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                      "stream": stream})
                assert r.status_code == 200
        p.wait_recorded(2)
        p.flush()
        upstream.flush()
        truth, mine = rows(store, "up", ids), rows(store, "px-tok", ids)
    for request_id in ids:
        m, t = mine[request_id], truth[request_id]
        # the same tokenizer as the upstream's: the same prompt IDs, made by the proxy, and marked as such
        assert list(m["prompt_token_ids"]) == list(t["prompt_token_ids"])
        assert json.loads(m["sampling_params_json"])["token_ids_source"] == "proxy_tokenizer"
        assert "token_ids_source" not in json.loads(t["sampling_params_json"])
        assert m["prompt_text_hash"] == t["prompt_text_hash"]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_a_store_that_is_down_costs_no_answer_and_the_rows_wait_in_the_spool(upstream, tmp_path):
    with BackgroundProxy.start(upstream.url, f"http://127.0.0.1:{_dead_port()}", "px-down",
                              recorder_kwargs={"spool_dir": tmp_path / "spool"}) as p:
        with httpx.Client(base_url=p.url, timeout=60) as client:
            for _ in range(3):
                r = client.post("/v1/completions", json={"model": upstream.model, "prompt": PROMPT, "max_tokens": 4})
                assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
        p.wait_recorded(3)
        p.flush()
        stats = p.parts.recorder.stats()["requests"]
        assert stats["spooled"] == 3 and stats["dropped"] == 0 and stats["written"] == 0
        # and Prometheus sees it on the proxy's own endpoint (the alert on drops reads it)
        scrape = httpx.get(p.url + "/infersight/metrics", timeout=10).text
        assert 'infersight_telemetry_rows_spooled_total{model="proxied",replica="px-down",table="requests"} 3.0' in scrape
