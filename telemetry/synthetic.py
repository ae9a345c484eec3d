"""Synthetic telemetry records: deterministic, plausible rows for every table.

For tests and benchmarks of the store, the sidecar and the recorder (no engine needed), and
for anyone who wants a populated store to look at.
"""

from __future__ import annotations

import hashlib
import json
import random
import time

from telemetry.contract.records import (
    EngineRequestTimingRecord,
    EvalItemRecord,
    EvalRunRecord,
    FindingRecord,
    ProbeBaselineRecord,
    ProfileRecord,
    ReplicaRecord,
    RequestRecord,
    StepRecord,
)

# the start of the current hour: recent enough that the tables' TTLs keep the rows
T0 = float(int(time.time()) // 3600 * 3600)


def replica(replica_id: str = "r0", start_time: float = T0) -> ReplicaRecord:
    config = json.dumps({"model": "tiny-llama", "max_num_seqs": 8})
    return ReplicaRecord(
        replica_id=replica_id, host="host-a", pid=4242, start_time=start_time, engine_version="0.1.0",
        model_name="tiny-llama", weights_hash="w" * 16, tokenizer_hash="t" * 16, chat_template_hash="c" * 16,
        config_json=config, config_hash=hashlib.sha256(config.encode()).hexdigest()[:16], dtype="float32",
        quantization="none", speculative_mode="none", attention_backend="torch", device="cpu",
        cpu_affinity=[0, 1], cpu_numa_nodes=[0], mem_policy_nodes=[0], gpu_numa_node=-1, numa_mismatch=False,
    )


def request(i: int, replica_id: str = "r0", t: float = T0, prompt_len: int = 32, output_len: int = 16,
            seed: int = 0) -> RequestRecord:
    rng = random.Random(f"{seed}-{replica_id}-{i}")
    arrival = t + i * 0.01
    queue, prefill = rng.uniform(0, 0.02), rng.uniform(0.005, 0.05)
    itl = rng.uniform(0.005, 0.02)
    times = [queue + prefill + k * itl for k in range(output_len)]
    return RequestRecord(
        replica_id=replica_id, request_id=f"{replica_id}-req-{i}", trace_id=f"{i:032x}", model_name="tiny-llama",
        workload=("chat", "agent", "batch")[i % 3], arrival_time=arrival, scheduled_time=arrival + queue,
        first_token_time=arrival + queue + prefill, finish_time=arrival + times[-1] if times else arrival,
        queue_seconds=queue, prefill_seconds=prefill, ttft_seconds=queue + prefill,
        e2e_seconds=times[-1] if times else 0.0, prompt_tokens=prompt_len, output_tokens=output_len,
        cached_tokens=rng.randrange(0, prompt_len + 1, 16),
        prompt_token_ids=[rng.randrange(32000) for _ in range(prompt_len)],
        output_token_ids=[rng.randrange(32000) for _ in range(output_len)], token_times=times,
        sampling_params_json='{"temperature": 0.0, "max_tokens": %d}' % output_len,
        finish_reason="length", prompt_text_hash=hashlib.sha256(f"p{i}".encode()).hexdigest(),
    )


def step(i: int, replica_id: str = "r0", t: float = T0, num_generated: int = 4) -> StepRecord:
    return StepRecord(
        replica_id=replica_id, step_id=i, start_time=t + i * 0.02, duration_seconds=0.015, phase="decode",
        num_seqs=num_generated, num_prefill_seqs=0, num_decode_seqs=num_generated, num_tokens=num_generated,
        num_prefill_tokens=0, num_decode_tokens=num_generated, num_generated_tokens=num_generated,
        schedule_seconds=0.0005, prepare_seconds=0.001, forward_seconds=0.012, sample_seconds=0.001,
        postprocess_seconds=0.0005, telemetry_seconds=0.00002, kv_blocks_total=256, kv_blocks_used=40,
        kv_blocks_free=216, kv_blocks_cached=8, prefix_hit_tokens=0, prefix_query_tokens=0, evictions=0,
        num_waiting=1, num_running=num_generated, num_preempted=0, spec_accepted_per_pos=[],
        num_context_tokens=num_generated * 40,  # each decoding sequence ~32 prompt + ~8 output tokens in
    )


def eval_run(run_id: str = "run-0", t: float = T0) -> EvalRunRecord:
    return EvalRunRecord(run_id=run_id, suite="arith", start_time=t, finish_time=t + 12.5, config_json="{}",
                         config_hash="cfg0", model_name="tiny-llama", weights_hash="w" * 16, quantization="none",
                         speculative_mode="none", git_sha="abc123", num_items=2, accuracy=0.5)


def eval_item(i: int, run_id: str = "run-0") -> EvalItemRecord:
    return EvalItemRecord(run_id=run_id, item_id=f"item-{i}", suite="arith", task="addition", scorer="exact",
                          score=float(i % 2), reference=str(i + i), output_text=str(i + i),
                          input_token_ids=[1, 2, 3, i], output_token_ids=[4, i], output_logprobs=[-0.1, -0.25],
                          latency_seconds=0.05)


def finding(finding_id: str = "f-0", last_seen: float = T0 + 60, severity: str = "warning",
            kind: str = "lagging_replica", subject: str = "r3", first_seen: float = T0) -> FindingRecord:
    return FindingRecord(finding_id=finding_id, kind=kind, severity=severity, subject=subject,
                         summary=f"{subject} is slower than its peers", window_start=T0 - 3600, window_end=last_seen,
                         evidence_json='{"p50_ratio": 1.8}', first_seen=first_seen, last_seen=last_seen,
                         diagnostic="replicas")


def profile(i: int, replica_id: str = "r0", t: float = T0) -> ProfileRecord:
    return ProfileRecord(profile_id="prof-0", replica_id=replica_id, pid=4242, start_time=t, duration_seconds=10.0,
                         stack=f"main;step;forward;layer_{i}", samples=10 + i, group="forward")


def probe_baseline(i: int, replica_id: str = "r0", t: float = T0) -> ProbeBaselineRecord:
    return ProbeBaselineRecord(model_name="tiny", probe_id=f"probe_{i}", pinned_time=t, round_id=f"p{int(t * 1000)}",
                               replica_id=replica_id, api="completions", weights_hash="w" * 16,
                               tokenizer_hash="t" * 16, chat_template_hash="", config_hash="c" * 16,
                               engine_version="0.1.0", prompt_text_hash=hashlib.sha256(str(i).encode()).hexdigest(),
                               rendered_prompt_hash="", sampling_params_json='{"temperature": 0.0}',
                               prompt_token_ids=[1, 2 + i, 3], output_token_ids=[4, 5, 6 + i], finish_reason="length")


def engine_request_timing(i: int, replica_id: str = "r0", t: float = T0) -> EngineRequestTimingRecord:
    arrival = t + i * 0.1
    return EngineRequestTimingRecord(replica_id=replica_id, request_id=f"req-{i}", engine_request_id=f"cmpl-req-{i}-0",
                                     model_name="tiny", arrival_time=arrival, scheduled_time=arrival + 0.002,
                                     first_token_time=arrival + 0.01, finish_time=arrival + 0.05, queue_seconds=0.002,
                                     prefill_seconds=0.008, ttft_seconds=0.01, e2e_seconds=0.05, prompt_tokens=10,
                                     output_tokens=8, cached_tokens=0, preemptions=0, finish_reason="length")


def records(table: str, n: int, replica_id: str = "r0", t: float = T0) -> list:
    """`n` records for `table`."""
    make = {
        "replicas": lambda i: replica(f"{replica_id}-{i}", t + i),
        "requests": lambda i: request(i, replica_id, t),
        "steps": lambda i: step(i, replica_id, t),
        "eval_runs": lambda i: eval_run(f"run-{i}", t + i),
        "eval_items": lambda i: eval_item(i),
        "findings": lambda i: finding(f"f-{i}", t + 60 + i),
        "profiles": lambda i: profile(i, replica_id, t),
        "probe_baselines": lambda i: probe_baseline(i, replica_id, t),
        "engine_request_timings": lambda i: engine_request_timing(i, replica_id, t),
    }[table]
    return [make(i) for i in range(n)]
