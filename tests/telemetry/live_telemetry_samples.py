"""Consistent StepRecord / RequestRecord / ReplicaRecord values for the metrics and tracing tests."""

from __future__ import annotations

import json

from telemetry.contract.records import ReplicaRecord, RequestRecord, StepRecord


def replica_record(replica_id="r0", model="tiny-llama", numa_mismatch=False, **overrides) -> ReplicaRecord:
    fields = dict(
        replica_id=replica_id, host="h", pid=1, start_time=1_700_000_000.0, engine_version="0.1.0",
        model_name=model, weights_hash="w" * 16, tokenizer_hash="t" * 16, chat_template_hash="c" * 16,
        config_json="{}", config_hash="cfg123", dtype="float32", quantization="none",
        speculative_mode="none", attention_backend="torch", device="cpu", numa_mismatch=numa_mismatch,
    )
    fields.update(overrides)
    return ReplicaRecord(**fields)


def request_record(request_id="req-0", *, replica_id="r0", model="tiny-llama", arrival=1_700_000_100.0,
                   queue=0.004, prefill=0.03, itls=(0.01, 0.02, 0.015), prompt_tokens=7, cached_tokens=0,
                   finish_reason="length", trace_id="", workload="chat", sampling=None, preemptions=0,
                   error="") -> RequestRecord:
    """A request that waited `queue`, prefilled in `prefill`, then produced 1 + len(itls) tokens."""
    scheduled = arrival + queue
    first = scheduled + prefill
    offsets = [queue + prefill]  # relative to arrival, computed without epoch rounding
    for gap in itls:
        offsets.append(offsets[-1] + gap)
    finish = arrival + offsets[-1]
    sampling = sampling or {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "max_tokens": 4, "seed": 11}
    return RequestRecord(
        replica_id=replica_id, request_id=request_id, trace_id=trace_id, model_name=model, workload=workload,
        arrival_time=arrival, scheduled_time=scheduled, first_token_time=first, finish_time=finish,
        queue_seconds=queue, prefill_seconds=prefill, ttft_seconds=offsets[0], e2e_seconds=offsets[-1],
        prompt_tokens=prompt_tokens, output_tokens=len(offsets), cached_tokens=cached_tokens,
        prompt_token_ids=list(range(1, prompt_tokens + 1)), output_token_ids=[5] * len(offsets),
        token_times=offsets, sampling_params_json=json.dumps(sampling), finish_reason=finish_reason,
        error=error, preemptions=preemptions,
    )


def queued_abort_record(request_id="req-abort", arrival=1_700_000_200.0, waited=0.5) -> RequestRecord:
    """A request aborted before it was ever scheduled: no first token, no token times."""
    return RequestRecord(
        replica_id="r0", request_id=request_id, trace_id="", model_name="tiny-llama", workload="",
        arrival_time=arrival, scheduled_time=0.0, first_token_time=0.0, finish_time=arrival + waited,
        queue_seconds=0.0, prefill_seconds=0.0, ttft_seconds=0.0, e2e_seconds=waited,
        prompt_tokens=3, output_tokens=0, cached_tokens=0, prompt_token_ids=[1, 2, 3], output_token_ids=[],
        token_times=[], sampling_params_json="{}", finish_reason="abort",
    )


def step_record(step_id=0, *, duration=0.010, forward=0.007, phase="decode", running=3, waiting=1,
                used=10, free=54, cached=4, total=64, preempted=0, prefix_query=0, prefix_hit=0,
                evictions=0, spec_proposed=0, spec_accepted=0, spec_per_pos=(), spec_drafts=0) -> StepRecord:
    return StepRecord(
        replica_id="r0", step_id=step_id, start_time=1_700_000_100.0 + step_id * duration,
        duration_seconds=duration, phase=phase, num_seqs=running, num_prefill_seqs=0, num_decode_seqs=running,
        num_tokens=running, num_prefill_tokens=0, num_decode_tokens=running, num_generated_tokens=running,
        schedule_seconds=0.001, prepare_seconds=0.001, forward_seconds=forward, sample_seconds=0.0005,
        postprocess_seconds=0.0005, telemetry_seconds=0.0,
        kv_blocks_total=total, kv_blocks_used=used, kv_blocks_free=free, kv_blocks_cached=cached,
        prefix_hit_tokens=prefix_hit, prefix_query_tokens=prefix_query, evictions=evictions,
        num_waiting=waiting, num_running=running, num_preempted=preempted,
        spec_proposed=spec_proposed, spec_accepted=spec_accepted, spec_accepted_per_pos=list(spec_per_pos), spec_num_drafts=spec_drafts,
    )
