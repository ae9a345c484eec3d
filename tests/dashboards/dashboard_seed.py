"""A small, known store for the dashboard tests: real records through the real store API.

Three replicas (r2 is a newer version with int8 and is slower), a few hundred requests whose
token IDs come from a real tokenizer, the steps they ran in, two eval runs that differ on a
few items, findings (one updated twice) and a py-spy profile.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass

from telemetry.contract.records import (
    EvalItemRecord,
    EvalRunRecord,
    FindingRecord,
    ProfileRecord,
    ReplicaRecord,
    RequestRecord,
    StepRecord,
)

# recent, on a whole hour: the tables' TTLs drop rows older than their retention at insert time
T0 = float(int(time.time()) // 3600 * 3600 - 2 * 3600)
MODEL = "tiny-llama"
SPECIAL_PROMPT = "  hello\n\tworld\u200b!"
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "What is 12 + 35?", "Reverse the string: hello",
           "Sort the numbers 5 3 9 1", "def add(a, b):\n    return a + b\n"]


@dataclass(frozen=True)
class Seeded:
    replicas: tuple[str, ...] = ("r0", "r1", "r2")
    requests: int = 0
    slowest_request: str = ""
    special_request: str = "req-special"
    special_output: str = "Hi there\nfriend"
    base_run: str = "run-base"
    candidate_run: str = "run-cand"
    drifted_item: str = "item-03"
    finding_summary: str = ""
    profile_id: str = "prof-r2"
    hot_frame: str = "forward (engine/core/model_runner.py:88)"


def replica(replica_id: str, version: str, config_hash: str, quantization: str, numa_mismatch: bool) -> ReplicaRecord:
    return ReplicaRecord(
        replica_id=replica_id, host="gpu-host-1", pid=1000 + int(replica_id[1:]), start_time=T0 - 600,
        engine_version=version, model_name=MODEL, weights_hash="w0", tokenizer_hash="tok0",
        chat_template_hash="tmpl0", config_json=json.dumps({"max_num_seqs": 8}), config_hash=config_hash,
        dtype="float32", quantization=quantization, speculative_mode="none", attention_backend="torch",
        device="cpu", cpu_affinity=[0, 1] if replica_id != "r1" else [8, 9], cpu_numa_nodes=[0] if replica_id != "r1" else [1],
        mem_policy_nodes=[0], gpu_numa_node=-1, numa_mismatch=numa_mismatch)


def request(request_id: str, replica_id: str, arrival: float, ttft: float, itl: float, prompt_ids, output_ids,
            finish_reason: str = "stop", prompt_text: str = "", workload: str = "chat") -> RequestRecord:
    queue = ttft * 0.2
    offsets = [ttft + i * itl for i in range(len(output_ids))]
    e2e = offsets[-1] if offsets else ttft
    return RequestRecord(
        replica_id=replica_id, request_id=request_id, trace_id=hashlib.sha256(request_id.encode()).hexdigest()[:32],
        model_name=MODEL, workload=workload,
        arrival_time=arrival, scheduled_time=arrival + queue, first_token_time=arrival + ttft,
        finish_time=arrival + e2e, queue_seconds=queue, prefill_seconds=ttft - queue, ttft_seconds=ttft,
        e2e_seconds=e2e, prompt_tokens=len(prompt_ids), output_tokens=len(output_ids), cached_tokens=0,
        prompt_text_hash=hashlib.sha256(prompt_text.encode()).hexdigest() if prompt_text else "",
        prompt_token_ids=list(prompt_ids), output_token_ids=list(output_ids), token_times=offsets,
        sampling_params_json=json.dumps({"temperature": 0.0, "max_tokens": 16}), finish_reason=finish_reason,
        prompt_text=prompt_text)


def step(replica_id: str, step_id: int, start: float, waiting: int, used: int) -> StepRecord:
    duration, forward = 0.02, 0.012
    return StepRecord(
        replica_id=replica_id, step_id=step_id, start_time=start, duration_seconds=duration,
        phase="prefill" if step_id % 10 == 0 else "decode", num_seqs=4, num_prefill_seqs=1 if step_id % 10 == 0 else 0,
        num_decode_seqs=3, num_tokens=40 if step_id % 10 == 0 else 4, num_prefill_tokens=36 if step_id % 10 == 0 else 0,
        num_decode_tokens=4, num_generated_tokens=4, schedule_seconds=0.002, prepare_seconds=0.002,
        forward_seconds=forward, sample_seconds=0.002, postprocess_seconds=0.001, telemetry_seconds=0.001,
        kv_blocks_total=64, kv_blocks_used=used, kv_blocks_free=64 - used, kv_blocks_cached=4,
        prefix_hit_tokens=8 if step_id % 10 == 0 else 0, prefix_query_tokens=36 if step_id % 10 == 0 else 0,
        evictions=1 if step_id % 25 == 0 else 0, num_waiting=waiting, num_running=4,
        num_preempted=1 if step_id % 50 == 0 else 0)


# the evidence diagnostics.replicas writes for a lagging replica (its shape, the seeded numbers)
LAGGING_EVIDENCE = {
    "model_name": MODEL, "replica": "r2", "peers": ["r0", "r1"], "unit": "request",
    "metrics": {"ttft": {"ratio_to_peers": 3.0, "ratio_ci": [2.6, 3.4], "bar": 1.15, "holm_p": 1e-9,
                         "test_vs_peers": {"n_subject": 100, "n_peers": 200, "strata": 4, "ratio": 3.0,
                                           "ratio_ci": [2.6, 3.4], "z": 8.1, "p_value": 1e-10}},
                "itl": {"ratio_to_peers": 2.9, "ratio_ci": [2.7, 3.1], "bar": 1.15, "holm_p": 2e-9,
                        "test_vs_peers": {"n_subject": 100, "n_peers": 200, "strata": 4, "ratio": 2.9,
                                          "ratio_ci": None, "z": 7.9, "p_value": 2e-10}}},
    "identity_differences": [{"field": "engine_version", "replica": "0.2.0", "peers": {"0.1.0": 2}},
                             {"field": "quantization", "replica": "int8", "peers": {"none": 2}},
                             {"field": "config_hash", "replica": "cfgB", "peers": {"cfgA": 2}}],
    "identity": {"engine_version": "0.2.0", "quantization": "int8", "cpu_affinity": [0, 1], "gpu_numa_node": None},
    "requests": {"r0": 101, "r1": 100, "r2": 101},
    "controlled_for": ["workload", "prompt length", "output length", "load at arrival"],
    "correction": "Holm over 18 tests (replicas x metrics)", "method": "van Elteren stratified MWU"}


def more_findings(encode, generated) -> list[FindingRecord]:
    """One finding of each view family the Findings page draws (plus a kind no view knows)."""
    def finding(fid, kind, severity, subject, summary, evidence, seen, diagnostic):
        return FindingRecord(finding_id=fid, kind=kind, severity=severity, subject=subject, summary=summary,
                             window_start=T0, window_end=T0 + 3000, evidence_json=json.dumps(evidence),
                             first_seen=T0 + seen, last_seen=T0 + seen, diagnostic=diagnostic)
    steps = {"model_name": MODEL, "replica": "r2", "peers": ["r0", "r1"], "slow_targets": ["forward"],
             "unit": "time blocks of 60 s (resampled jointly across replicas)", "steps": 200, "blocks": 25,
             "targets": {"forward": {"ratio": 1.8, "ci": [1.5, 2.1], "p": 1e-6, "p_holm": 1e-5, "bar": 1.1,
                                     "observed_seconds": 4.3, "predicted_seconds": 2.4, "slow": True},
                         "gap": {"ratio": 1.7, "ci": [1.5, 1.9], "p": 1e-5, "p_holm": 1e-4, "bar": 1.41,
                                 "observed_seconds": 0.9, "predicted_seconds": 0.5, "slow": True},
                         "host": {"ratio": 1.0, "ci": [0.9, 1.1], "p": 0.5, "p_holm": 1.0,
                                  "observed_seconds": 1.6, "predicted_seconds": 1.6, "slow": False}},
             "mean_shape": {"replica": {"prefill_tokens": 3.6, "decode_tokens": 4.0},
                            "peers": {"prefill_tokens": 3.6, "decode_tokens": None}},
             "identity_differences": [{"field": "quantization", "replica": "int8", "peers": {"none": 2}}],
             "test": "one-sided block bootstrap", "controlled_for": "batch shape"}
    levels = [{"t": T0 + k * 60, "relative_median": 1.0 if k < 20 else 1.6, "n": 12} for k in range(40)]
    change = {"metric": "ttft", "change_at": T0 + 1200, "change_at_iso": "", "bucket_seconds": 60,
              "change_points": 1, "levels": levels,
              "comparison": {"n_baseline": 120, "n_candidate": 120, "median_baseline": 0.1, "median_candidate": 0.16,
                             "ratio": 1.6, "ratio_ci": [1.4, 1.8], "mwu_p": 1e-8, "ks_p": 1e-7},
              "method": "ruptures PELT on the placement half", "confirmation": "hold-out half"}
    drift = {"replica": "r2", "model_name": MODEL, "compared": 40, "differ": 6, "rate": 0.15, "rate_ci": [0.07, 0.29],
             "examples": [{"reference_replica": "r0", "prompt_token_ids": encode("What is 12 + 35?"),
                           "replica_token_ids": generated("The answer is 74!"),
                           "reference_token_ids": generated("The answer is 47."), "first_divergence": 3,
                           "identical": False}],
             "method": "greedy requests grouped by prompt token IDs"}
    gap = {"replica": "r1", "hit_rate": 0.22, "peers_hit_rate": 0.61, "difference": -0.39,
           "difference_ci": [-0.45, -0.33], "requests": 100, "unit": "request", "p_value": 1e-12, "note": None}
    unknown = {"replica": "r1", "score": 0.5, "nested": {"a": 1, "b": None}, "method": "a diagnostic added later"}
    return [
        finding("f-steps", "slow_steps", "warning", "r2", "r2 takes 1.80x [1.50, 2.10] the forward time its peers take",
                steps, 2400, "step_model"),
        finding("f-cp", "latency_change_point", "warning", "ttft: all replicas",
                "time to first token stepped up 1.60x at T0+20 min", change, 2300, "regression"),
        finding("f-drift", "output_drift", "warning", "r2", "r2: greedy outputs differ from the reference on 6 of 40",
                drift, 2200, "output_drift"),
        finding("f-gap", "prefix_hit_gap", "info", "r1", "r1: prefix cache hit rate 22% against its peers' 61%",
                gap, 2600, "replicas"),
        finding("f-new", "a_kind_added_later", "info", "r1", "a finding of a kind no view knows", unknown, 2500, "new"),
    ]


def seed(store, tokenizer, n_requests: int = 300) -> Seeded:
    """Insert the known data set; `tokenizer` is a `tokenizers.Tokenizer`."""
    rng = random.Random(0)
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731  (prompts: with BOS)
    generated = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    store.insert_records("replicas", [
        replica("r0", "0.1.0", "cfgA", "none", False),
        replica("r1", "0.1.0", "cfgA", "none", True),
        replica("r2", "0.2.0", "cfgB", "int8", False),
    ])
    requests, slowest = [], ("", 0.0)
    for i in range(n_requests):
        replica_id = ("r0", "r1", "r2")[i % 3]
        slow = 3.0 if replica_id == "r2" else 1.0
        ttft = rng.uniform(0.05, 0.2) * slow
        prompt = PROMPTS[i % len(PROMPTS)]
        out = generated(PROMPTS[(i + 1) % len(PROMPTS)])[:8]
        r = request(f"req-{i:04d}", replica_id, T0 + i * 10, ttft, 0.02 * slow, encode(prompt), out,
                    finish_reason="length" if i % 7 == 0 else "stop", prompt_text=prompt,
                    workload="batch" if i % 4 == 0 else "chat")
        if r.e2e_seconds > slowest[1]:
            slowest = (r.request_id, r.e2e_seconds)
        requests.append(r)
    special = request("req-special", "r0", T0 + 5, 0.1, 0.05, encode(SPECIAL_PROMPT), generated("Hi there\nfriend"),
                      prompt_text=SPECIAL_PROMPT)
    requests.append(special)
    # the same prompt text tokenized differently on r2 (a tokenizer divergence for the deep dives)
    requests.append(request("req-divergent", "r2", T0 + 7, 0.3, 0.06, encode(PROMPTS[0].replace(" ", "  ")),
                            generated("Hi"), prompt_text=PROMPTS[0]))
    store.insert_records("requests", requests)

    steps = []
    for replica_id in ("r0", "r1", "r2"):
        for s in range(200):
            steps.append(step(replica_id, s, T0 + s * 0.5 * 15, waiting=s % 5 if replica_id != "r2" else 6,
                              used=20 + s % 30))
    # steps of r0 during the special request's lifetime (arrival T0+5 .. finish)
    steps += [step("r0", 1000 + k, T0 + 5 + 0.1 + 0.05 * k, waiting=0, used=10) for k in range(5)]
    store.insert_records("steps", steps)

    runs = [EvalRunRecord(run_id=run_id, suite="arith", start_time=T0 + k * 100, finish_time=T0 + k * 100 + 60,
                          config_json="{}", config_hash=f"cfg{k}", model_name=MODEL, weights_hash="w0",
                          quantization=("none", "int8")[k], speculative_mode="none", git_sha="abc123",
                          num_items=10, accuracy=(0.9, 0.7)[k])
            for k, run_id in enumerate(("run-base", "run-cand"))]
    store.insert_records("eval_runs", runs)
    items = []
    for k, run_id in enumerate(("run-base", "run-cand")):
        for j in range(10):
            drift = k == 1 and j in (3, 7)
            text = "The answer is 47." if not drift else "The answer is 74!"
            score = 1.0 if (j != 9 and not drift) else 0.0
            items.append(EvalItemRecord(run_id=run_id, item_id=f"item-{j:02d}", suite="arith",
                                        task="addition" if j < 5 else "reverse", scorer="exact", score=score,
                                        reference="47", output_text=text, input_token_ids=encode("What is 12 + 35?"),
                                        output_token_ids=generated(text)))
    # a suite with a single run (nothing to compare it with): the page shows its accuracy per task
    runs.append(EvalRunRecord(run_id="run-solo", suite="words", start_time=T0 + 300, finish_time=T0 + 360,
                              config_json="{}", config_hash="cfg0", model_name=MODEL, weights_hash="w0",
                              quantization="none", speculative_mode="none", git_sha="abc123", num_items=8,
                              accuracy=0.625))
    store.insert_records("eval_runs", runs[-1:])
    items += [EvalItemRecord(run_id="run-solo", item_id=f"w-{j:02d}", suite="words", task=("spell", "count")[j % 2],
                             scorer="exact", score=float(j not in (1, 3, 4)), reference="x", output_text="x",
                             input_token_ids=encode("x"), output_token_ids=generated("x")) for j in range(8)]
    store.insert_records("eval_items", items)

    summary = "r2 is 3.0x slower than its peers (TTFT p50)"
    store.insert_records("findings", [
        FindingRecord(finding_id="f-lag", kind="lagging_replica", severity="info", subject="r2",
                      summary="r2 looks slower (too few samples)", window_start=T0, window_end=T0 + 1000,
                      evidence_json="{}", first_seen=T0 + 1000, last_seen=T0 + 1000, diagnostic="replicas"),
        FindingRecord(finding_id="f-lag", kind="lagging_replica", severity="warning", subject="r2",
                      summary=summary, window_start=T0, window_end=T0 + 3000,
                      evidence_json=json.dumps(LAGGING_EVIDENCE), first_seen=T0 + 1000,
                      last_seen=T0 + 3000, diagnostic="replicas"),
        FindingRecord(finding_id="f-tok", kind="tokenizer_divergence", severity="critical", subject="r0 vs r2",
                      summary="same prompt, different token IDs on r0 and r2", window_start=T0,
                      window_end=T0 + 3000, first_seen=T0 + 2000, last_seen=T0 + 2000, diagnostic="tokenizer",
                      evidence_json=json.dumps({"model_name": MODEL, "first_divergence": 4,
                                                "r0_token_ids": encode("hello world"),
                                                "r2_token_ids": encode("hello  world")})),
    ] + more_findings(encode, generated))
    store.insert_records("profiles", [
        ProfileRecord(profile_id="prof-r2", replica_id="r2", pid=1002, start_time=T0 + 100, duration_seconds=10,
                      stack=stack, samples=n, group=group)
        for stack, n, group in [
            ("main (engine/server.py:10);step (engine/core/engine.py:50);forward (engine/core/model_runner.py:88)", 600, "forward"),
            ("main (engine/server.py:10);step (engine/core/engine.py:50);schedule (engine/core/scheduler.py:30)", 250, "scheduler"),
            ("main (engine/server.py:10);step (engine/core/engine.py:50);on_step (telemetry/recorder.py:77)", 50, "telemetry"),
            ("main (engine/server.py:10);sample (engine/core/sampler.py:12)", 100, "sampling"),
        ]])
    return Seeded(requests=len(requests), slowest_request=slowest[0], finding_summary=summary)
