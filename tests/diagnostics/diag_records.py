"""Telemetry records for diagnostics tests: real record types, controlled numbers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord


# each replica deployed on its own, this long before its start row (loading): replicas whose start rows are
# further apart than this were deployed one after the other (diagnostics/baseline.py); pass deploy_time to
# start several together
DEPLOY_LEAD = 30.0


def replica(replica_id: str, start: float, *, model_dir: str = "/nonexistent", model_name: str = "tiny",
            version: str = "0.1.0", tokenizer_hash: str = "tok-a", chat_template_hash: str = "tmpl-a",
            config_hash: str = "cfg-a", cpus=(0, 1), **overrides) -> ReplicaRecord:
    config = {"model": str(model_dir), "quantization": overrides.get("quantization", "none")}
    r = ReplicaRecord(replica_id=replica_id, host="host-a", pid=1000, start_time=start, engine_version=version,
                      model_name=model_name, weights_hash="w", tokenizer_hash=tokenizer_hash,
                      chat_template_hash=chat_template_hash, config_json=json.dumps(config), config_hash=config_hash,
                      dtype="float32", quantization="none", speculative_mode="none", attention_backend="torch",
                      device="cpu", cpu_affinity=list(cpus), cpu_numa_nodes=[0], mem_policy_nodes=[0],
                      deploy_time=start - DEPLOY_LEAD)
    return dataclasses.replace(r, **overrides)


def request(replica_id: str, i: int, t: float, *, ttft: float = 0.02, itl: float = 0.01, queue: float = 0.001,
            prompt_ids=None, output_ids=None, workload: str = "chat", model_name: str = "tiny",
            prompt_text: str | None = None, store_text: bool = False, output_text: str = "",
            temperature: float = 0.0, **overrides) -> RequestRecord:
    prompt_ids = list(prompt_ids if prompt_ids is not None else [0, 5, 6, 7])
    output_ids = list(output_ids if output_ids is not None else [8, 9, 10, 11])
    n = len(output_ids)
    times = [ttft + k * itl for k in range(n)]
    e2e = times[-1] if times else ttft
    r = RequestRecord(
        replica_id=replica_id, request_id=f"{replica_id}-{i}", trace_id="", model_name=model_name, workload=workload,
        arrival_time=t, scheduled_time=t + queue, first_token_time=t + ttft, finish_time=t + e2e,
        queue_seconds=queue, prefill_seconds=ttft - queue, ttft_seconds=ttft, e2e_seconds=e2e,
        prompt_tokens=len(prompt_ids), output_tokens=n, cached_tokens=0, prompt_token_ids=prompt_ids,
        output_token_ids=output_ids, token_times=times,
        sampling_params_json=json.dumps({"temperature": temperature, "max_tokens": n, "stop": [],
                                         "stop_token_ids": []}),
        finish_reason="length",
        prompt_text_hash=hashlib.sha256(prompt_text.encode()).hexdigest() if prompt_text is not None else "",
        prompt_text=prompt_text if (store_text and prompt_text is not None) else "",
        output_text=output_text)
    return dataclasses.replace(r, **overrides)


def jittered(rng: random.Random, value: float, spread: float = 0.2) -> float:
    """`value` times a log-normal factor: latencies are skewed, never negative."""
    return value * rng.lognormvariate(0.0, spread)


def step(replica_id: str, i: int, t: float, *, duration: float = 0.01, forward: float = 0.007, num_seqs: int = 4,
         phase: str = "decode", spec_proposed: int = 0, spec_accepted: int = 0, per_pos=(), **overrides) -> StepRecord:
    host = duration - forward
    r = StepRecord(replica_id=replica_id, step_id=i, start_time=t, duration_seconds=duration, phase=phase,
                   num_seqs=num_seqs, num_prefill_seqs=0, num_decode_seqs=num_seqs, num_tokens=num_seqs,
                   num_prefill_tokens=0, num_decode_tokens=num_seqs, num_generated_tokens=num_seqs,
                   schedule_seconds=host * 0.3, prepare_seconds=host * 0.3, forward_seconds=forward,
                   sample_seconds=host * 0.2, postprocess_seconds=host * 0.1, telemetry_seconds=host * 0.1,
                   kv_blocks_total=64, kv_blocks_used=8, kv_blocks_free=56, kv_blocks_cached=0, prefix_hit_tokens=0,
                   prefix_query_tokens=0, evictions=0, num_waiting=0, num_running=num_seqs, num_preempted=0,
                   spec_proposed=spec_proposed, spec_accepted=spec_accepted, spec_accepted_per_pos=list(per_pos))
    return dataclasses.replace(r, **overrides)
