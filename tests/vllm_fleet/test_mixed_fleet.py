"""One fleet, two engines: an infersight replica (r0) and a vLLM replica (v0) of the reference model,
brought up by `fleet_up` with the same store, under loadgen traffic plus a few identical greedy
prompts; then a vLLM replica whose chat template was edited (v1) gets the same prompts.

- the clean pair (r0, v0): every answered request is stored with its token IDs, v0's replica row
  is vLLM's identity, its steps add up, and `infersight diagnose all` finds nothing above info;
- with v1: the tokenizer diagnostic names v1 (r0 and v0 agree: the majority), with the first
  divergent token, and its chat template.
Bounded: two vLLM servers start at once (minutes on the shared 2-core machine), ~30 s of traffic.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from vllm_fleet_marks import vllm_marks

from engine.serving.fleet.config import parse_fleet
from engine.serving.fleet.fleet import fleet_down, fleet_up
from engine.core.model_refs import REFERENCE_MODEL
from telemetry.contract import derived
from telemetry.store import open_store

pytestmark = [*vllm_marks(), pytest.mark.slow]

SERVED = "target"
# the reference template with one change a person could make by mistake: a newline after each role marker
ALTERED_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + "
                    "message['content'] + eos_token }}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|assistant|>' }}{% endif %}")
QUESTIONS = ["What is two plus two?", "Name a colour.", "Count to three.", "Say hello.", "Spell cat."]
PROMPTS = ["The quick brown fox", "1 + 1 =", "Once upon a time", "The capital of France is", "A B C D"]
VLLM = {"max_model_len": 256, "max_num_seqs": 8}
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def infersight(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dashboards.console.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def findings(store_url: str, diagnostic: str, since: float, until: float, replicas: str) -> list[dict]:
    result = infersight("diagnose", diagnostic, "--store", store_url, "--since", f"{since:.3f}",
                        "--until", f"{until:.3f}", "--replicas", replicas, "--json", "--no-write")
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def greedy_probes(url: str, tag: str) -> list[str]:
    """The same greedy prompts on every replica (as a prober sends them): completions and chats."""
    ids = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for prompt, question in zip(PROMPTS, QUESTIONS):
            for path, body in (("/v1/completions", {"prompt": prompt}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": question}]})):
                request_id = f"{tag}-{uuid.uuid4().hex[:12]}"
                r = client.post(path, headers={"X-Request-Id": request_id, "X-Workload": "probe"},
                                json={"model": SERVED, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **body})
                assert r.status_code == 200, r.text
                ids.append(request_id)
    return ids


def wait_for_rows(store, ids: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        n = store.query_df("SELECT count() AS n FROM requests WHERE has({ids:Array(String)}, request_id)",
                           {"ids": ids})["n"][0]
        if n >= len(ids) or time.monotonic() > deadline:
            return
        time.sleep(0.25)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed-fleet")
    altered = root / "target-template-edited"
    shutil.copytree(REFERENCE_MODEL, altered)
    (altered / "chat_template.jinja").write_text(ALTERED_TEMPLATE)
    config = parse_fleet({
        "fleet": {"name": "mixed", "run_dir": str(root / "run"), "startup_timeout": 900, "stop_timeout": 60},
        "sidecar": {"port": 0},
        "defaults": {"model": "reference"},
        "replica": [
            {"id": "r0", "cpus": "0", "engine": {"max_num_seqs": 8, "kv_cache_memory_bytes": "32MiB"}},
            {"id": "v0", "engine": "vllm", "cpus": "1", "vllm": VLLM, "env": VLLM_ENV},
            {"id": "v1", "engine": "vllm", "cpus": "1", "model": str(altered),
             "vllm": {**VLLM, "served_model_name": SERVED}, "env": VLLM_ENV},
        ]})
    state = fleet_up(config, progress=lambda m: print(f"[fleet] {m}", flush=True))
    try:
        yield state
    finally:
        print(fleet_down(state.run_dir))


@pytest.fixture(scope="module")
def clean_run(fleet):
    """Phase 1: loadgen over r0 and v0, then the greedy probes on both."""
    urls = {r.name: r.url for r in fleet.replicas}
    t0 = time.time()
    out = fleet.run_dir + "/loadgen.json"
    result = infersight("loadgen", "--endpoints", f"{urls['r0']},{urls['v0']}", "--workload", "mixed",
                        "--arrival", "poisson:1", "--duration", "20", "--max-tokens", "12", "--prompt-scale", "0.1",
                        "--no-progress",
                        "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    load = json.load(open(out))["requests"]
    probes = {rid: greedy_probes(urls[rid], f"p1-{rid}") for rid in ("r0", "v0")}
    store = open_store(fleet.store_url)
    wait_for_rows(store, [r["request_id"] for r in load] + [i for ids in probes.values() for i in ids])
    time.sleep(3)  # the plugin's steps and the replicas' last rows: a flush interval
    t1 = time.time()
    yield {"t0": t0, "t1": t1, "load": load, "probes": probes, "urls": urls, "store": store,
           "store_url": fleet.store_url}
    store.close()


def test_every_answered_request_is_stored_with_its_token_ids(clean_run):
    store, load = clean_run["store"], clean_run["load"]
    answered = [r for r in load if r["ok"]]
    assert len(answered) == len(load) >= 10 and {r["replica"] for r in answered} == {"r0", "v0"}
    rows = store.query_df("SELECT request_id, replica_id, output_tokens, length(output_token_ids) AS n_out, "
                          "length(prompt_token_ids) AS n_prompt, prompt_tokens, length(token_times) AS n_times "
                          "FROM requests WHERE has({ids:Array(String)}, request_id)",
                          {"ids": [r["request_id"] for r in answered]})
    by_id = {r["request_id"]: r for r in rows.to_dict("records")}
    for r in answered:
        row = by_id[r["request_id"]]
        assert row["replica_id"] == r["replica"]
        assert row["output_tokens"] == row["n_out"] == r["output_tokens"] > 0
        assert row["prompt_tokens"] == row["n_prompt"] == r["prompt_tokens"] > 0
        if r["stream"]:
            assert row["n_times"] == row["output_tokens"]


def test_the_vllm_replicas_requests_join_vllms_own_timing(clean_run):
    """Behind the proxy the plugin writes no request rows but vLLM's timing of each request, under the
    proxy's request id: joined, a request has vLLM's queue / prefill split and the proxy's token IDs."""
    store, load = clean_run["store"], clean_run["load"]
    ids = [r["request_id"] for r in load if r["ok"] and r["replica"] == "v0"]
    queue = derived.engine_timed_sql("queue_seconds")
    rows = store.query_df(f"SELECT t.request_id AS id, e.engine_request_id AS engine_id, {queue} AS queue, "
                          "e.queue_seconds + e.prefill_seconds - e.ttft_seconds AS split_gap, "
                          "e.ttft_seconds AS engine_ttft, t.ttft_seconds AS proxy_ttft, "
                          "e.output_tokens AS engine_out, length(t.output_token_ids) AS proxy_out "
                          f"FROM requests AS t {derived.ENGINE_TIMING_JOIN_SQL} "
                          "WHERE t.replica_id = 'v0' AND has({ids:Array(String)}, t.request_id)", {"ids": ids})
    assert len(ids) >= 3 and sorted(rows["id"]) == sorted(ids)
    assert all(e.startswith(("cmpl-", "chatcmpl-")) and i in e for i, e in zip(rows["id"], rows["engine_id"]))
    assert (rows["engine_out"] == rows["proxy_out"]).all() and (rows["proxy_out"] > 0).all()
    assert (rows["queue"] >= 0).all() and (rows["split_gap"].abs() < 1e-6).all()  # queue + prefill = TTFT
    streamed = rows[rows["proxy_ttft"] > 0]  # the proxy sees a first token only in a stream
    assert (streamed["engine_ttft"] <= streamed["proxy_ttft"] + 0.05).all()  # the engine got it after the proxy
    assert (rows["engine_ttft"] > 0).all()  # and a non-streamed request gets its TTFT from the engine


def test_the_vllm_replica_row_is_vllms_identity(clean_run):
    rows = clean_run["store"].query_df("SELECT * FROM replicas WHERE replica_id IN ('r0', 'v0')").to_dict("records")
    by_id = {r["replica_id"]: r for r in rows}
    v0, r0 = by_id["v0"], by_id["r0"]
    assert v0["engine_version"].startswith("vllm") and v0["model_name"] == r0["model_name"] == SERVED
    # the same model files: the same tokenizer, template and weights, hashed the engine's way
    for column in ("tokenizer_hash", "chat_template_hash", "weights_hash"):
        assert v0[column] == r0[column] != "", column
    assert v0["config_hash"] != r0["config_hash"]


def test_the_vllm_replicas_steps_add_up_to_its_generated_tokens(clean_run):
    store = clean_run["store"]
    generated = store.query_df("SELECT sum(num_generated_tokens) AS n FROM steps WHERE replica_id = 'v0'")["n"][0]
    # every request v0 served in phase 1 (its probes and its loadgen share); v1 has served none yet
    output = store.query_df("SELECT sum(output_tokens) AS n FROM requests WHERE replica_id = 'v0' "
                            "AND prompt_text_hash != ''")["n"][0]
    # and the token of the proxy's own logprobs warm-up (RecordingProxy._warm_logprobs): vLLM computed it and
    # timed it, no client asked for it, so it has an engine timing row and no request row
    from engine.serving.proxy.app import WARMUP_REQUEST_PREFIX

    warmup = store.query_df("SELECT count() AS c, sum(output_tokens) AS n FROM engine_request_timings "
                            "WHERE replica_id = 'v0' AND startsWith(request_id, {p:String})",
                            {"p": WARMUP_REQUEST_PREFIX})
    assert int(warmup["c"][0]) == 1
    assert generated == output + warmup["n"][0] and output > 0


def test_the_same_greedy_prompts_give_the_same_tokens_on_both_engines(clean_run):
    """The reference model on vLLM and on infersight: the same prompt token IDs and the same greedy
    output, request for request (what the drift diagnostic pairs up)."""
    probes = clean_run["probes"]
    rows = clean_run["store"].query_df(
        "SELECT request_id, prompt_token_ids, output_token_ids, sampling_params_json FROM requests "
        "WHERE has({ids:Array(String)}, request_id)", {"ids": probes["r0"] + probes["v0"]}).to_dict("records")
    by_id = {r["request_id"]: r for r in rows}
    for ours, theirs in zip(probes["r0"], probes["v0"]):
        a, b = by_id[ours], by_id[theirs]
        assert list(a["prompt_token_ids"]) == list(b["prompt_token_ids"])
        assert a["sampling_params_json"] == b["sampling_params_json"]
        assert list(a["output_token_ids"]) == list(b["output_token_ids"]), ours


def test_fleet_status_shows_each_vllm_server_behind_its_proxy(fleet):
    from engine.serving.fleet.fleet import fleet_status

    rows = {r["name"]: r for r in fleet_status(fleet)}
    assert rows["v0/vllm"]["kind"] == "upstream" and rows["v0"]["kind"] == "replica"
    assert all(rows[n]["healthy"] for n in ("r0", "v0", "v1", "v0/vllm", "v1/vllm", "sidecar"))
    assert rows["v0"]["detail"]["replica_id"] == "v0"  # the proxy answers /health as the replica


@pytest.mark.parametrize("diagnostic", ["tokenizer", "drift", "replicas", "speculative"])
def test_the_clean_pair_agree_on_tokens_outputs_and_latency(clean_run, diagnostic):
    """Compared like two replicas: the same tokens for the same text, the same greedy outputs, no replica
    lagging its peer, whatever engine serves it."""
    found = findings(clean_run["store_url"], diagnostic, clean_run["t0"], clean_run["t1"], "r0,v0")
    print("\n".join(f"{f['severity']} {f['kind']} {f['subject']}: {f['summary']}" for f in found))
    loud = [f"{f['severity']} {f['kind']} {f['subject']}: {f['summary']}" for f in found if f["severity"] != "info"]
    assert not loud, "\n".join(loud)


def test_a_clean_mixed_fleet_gives_nothing_above_info(clean_run):
    found = findings(clean_run["store_url"], "all", clean_run["t0"], clean_run["t1"], "r0,v0")
    loud = [f"{f['severity']} {f['kind']} {f['subject']}: {f['summary']}" for f in found if f["severity"] != "info"]
    assert not loud, "\n".join(loud)


def test_an_edited_chat_template_on_a_vllm_replica_is_named_with_the_first_divergent_token(clean_run, fleet):
    t1 = clean_run["t1"]
    urls = clean_run["urls"]
    ids = [i for rid in ("r0", "v0", "v1") for i in greedy_probes(urls[rid], f"p2-{rid}")]
    wait_for_rows(clean_run["store"], ids)
    found = findings(fleet.store_url, "tokenizer", t1, time.time() + 1, "r0,v0,v1")
    loud = [f for f in found if f["severity"] != "info"]
    assert {f["subject"] for f in loud} == {"v1"}, [f["summary"] for f in loud]
    divergent = next(f for f in loud if f["kind"] == "tokenizer_divergence")
    ex = divergent["evidence"]["examples"][0]
    pos = ex["first_divergence"]
    assert ex["reference_replica"] in ("r0", "v0")
    assert ex["replica_token_ids"][:pos] == ex["reference_token_ids"][:pos]
    assert ex["replica_token_ids"][pos] != ex["reference_token_ids"][pos]
    assert "first divergence at token" in divergent["summary"]
    assert divergent["evidence"]["divergent"] == len(QUESTIONS)  # every chat; the completions agree
    # the template's hash difference is the identity diagnostic's (diagnostics/identity.py)
    identity = findings(fleet.store_url, "identity", t1, time.time() + 1, "r0,v0,v1")
    assert "v1" in {f["subject"] for f in identity if f["kind"] == "chat_template_mismatch" and f["severity"] != "info"}
