"""Server extras as a vLLM user expects them: /version, /detokenize, HEAD /metrics, process metrics,
an access log line per request and the periodic stats line."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from engine.serving.server.server_log import StatsLogger, StepThroughput, redact_url, start_summary


def test_version(client):
    r = client.get("/version")
    assert r.status_code == 200 and isinstance(r.json()["version"], str) and r.json()["version"]


def test_detokenize_round_trips_tokenize(client, live):
    name = live.served.name
    ids = client.post("/tokenize", json={"model": name, "prompt": "hello world"}).json()["tokens"]
    r = client.post("/detokenize", json={"model": name, "tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": live.served.tokenizer.decode(ids, skip_special_tokens=False)}  # as vLLM's
    assert "hello world" in r.json()["prompt"]
    bad = client.post("/detokenize", json={"model": name, "tokens": [live.served.vocab_size]})
    assert bad.status_code == 400
    assert client.post("/detokenize", json={"model": "other", "tokens": [1]}).status_code == 404


def test_metrics_head_and_process_metrics(client):
    assert client.head("/metrics").status_code == 200
    body = client.get("/metrics").text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "infersight_prompt_tokens_total"):
        assert name in body, name


def test_access_log_line_per_request(client, live, caplog):
    caplog.set_level(logging.INFO, logger="infersight.access")
    r = client.post("/v1/completions", headers={"X-Request-Id": "acc-log-1"}, json={
        "model": live.served.name, "prompt": "one two", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200
    s = client.post("/v1/completions", headers={"X-Request-Id": "acc-log-2"}, json={
        "model": live.served.name, "prompt": "one two", "max_tokens": 2, "ignore_eos": True, "stream": True})
    assert s.status_code == 200 and "[DONE]" in s.text
    live.wait_idle()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "infersight.access"]
    full = next(line for line in lines if line.startswith("acc-log-1 "))
    assert " 200 " in full and "output_tokens=3" in full and "ttft=" in full and "ms" in full
    prompt_tokens = len(live.served.tokenizer.encode("one two"))
    assert f"prompt_tokens={prompt_tokens}" in full
    streamed = next(line for line in lines if line.startswith("acc-log-2 "))
    assert " 200 " in streamed and "output_tokens=2" in streamed


def test_stats_line_rates_over_the_interval(live):
    now = [100.0]
    counter = StepThroughput()
    stats = StatsLogger(live.served, counter, interval=5, clock=lambda: now[0])
    counter.on_step(SimpleNamespace(num_prefill_tokens=300, num_generated_tokens=40))
    counter.on_step(SimpleNamespace(num_prefill_tokens=0, num_generated_tokens=10))
    now[0] += 5.0
    line = stats.line()
    assert "Avg prompt throughput: 60.0 tokens/s" in line and "Avg generation throughput: 10.0 tokens/s" in line
    assert "Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0.0%" in line
    now[0] += 2.0  # nothing new: the next interval's rates are zero, not the cumulative average
    assert "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s" in stats.line()


def test_start_summary_names_the_replica(live):
    text = "\n".join(start_summary(live.served.engine.engine, None, "http://user:secret@store:9000/?token=abc"))
    for part in ("LlamaForCausalLM", "dtype float32", "quantization none", "80 blocks of 16 = 1280 tokens",
                 "max_model_len 1024", "speculative decoding none", "CPUs", "http://store:9000/"):
        assert part in text, part
    assert "secret" not in text and "token=abc" not in text


def test_redact_url():
    assert redact_url("http://u:p@h:1/x?k=v") == "http://h:1/x"
    assert redact_url("/data/store") == "/data/store"
    assert redact_url(None).startswith("none")


def test_start_summary_names_a_pinned_placement(live):
    from engine.core.placement import Placement

    pinned = Placement(cpu_affinity=[0, 1], cpu_numa_nodes=[0], mem_policy_nodes=[0], mem_policy="bind")
    text = "\n".join(start_summary(live.served.engine.engine, pinned, "/data/store"))
    assert "placement: CPUs [0, 1] (NUMA nodes [0], memory bind [0])" in text and "store: /data/store" in text
