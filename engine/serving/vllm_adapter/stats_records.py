"""vLLM's per-iteration stats as infersight records: one `steps` row per engine iteration, one
`requests` row per finished request.

What vLLM hands a stat logger (vllm/v1/metrics/stats.py), read by attribute only, so this module
imports nothing of vLLM:
- `SchedulerStats` (from the engine core, each step): running / waiting, KV usage (a fraction),
  the step's prefix-cache queries and hits, spec-decode counters, and, with vLLM's
  `--enable-logging-iteration-details`, `iteration_details` (context / generation requests and
  tokens of the batch, the iteration's elapsed time);
- `IterationStats` (built by the front end for the same step): tokens generated, prompts whose
  prefill completed, preemptions, and `finished_requests` (`FinishedRequestStats`).

Columns vLLM does not provide keep their defaults (documented in README.md, "vLLM replicas"):
the host-time split (schedule / prepare / sample / postprocess / telemetry: 0), `kv_blocks_cached`
and `evictions` (0), a request's token IDs, per-token times, text hashes, sampling params, trace
id and workload (empty: the recording proxy writes them, joined on the request id).
"""

from __future__ import annotations

import json

from engine.serving.vllm_adapter.request_ids import proxy_request_id
from telemetry.contract.derived import e2e_seconds, ttft_split
from telemetry.contract.records import EngineRequestTimingRecord, RequestRecord, StepRecord

# vLLM's FinishReason names -> the contract's finish_reason (repetition: vLLM stopped a degenerate output)
FINISH_REASONS = {"STOP": "stop", "LENGTH": "length", "ABORT": "abort", "ERROR": "error", "REPETITION": "stop"}


def finish_reason_name(reason) -> str:
    name = getattr(reason, "name", None) or str(reason)
    return FINISH_REASONS.get(name.upper(), name.lower())


def request_record(finished, now: float, *, replica_id: str, model_name: str) -> RequestRecord:
    """A `FinishedRequestStats` seen at front-end time `now` (the IterationStats' timestamp, from which
    vLLM measured its e2e latency) as a request row.

    vLLM gives durations, not instants: arrival = now - e2e; the first token came `decode_time` before
    the last one (≈ now); the first scheduling `prefill_time` before the first token. So queue is
    arrival -> scheduled as infersight defines it (vLLM's own `queued_time` starts later, when the
    engine core got the request), and queue + prefill = TTFT as in every infersight row.
    """
    arrival = now - max(0.0, float(finished.e2e_latency))
    output_tokens = int(finished.num_generation_tokens)
    first_token = scheduled = 0.0
    if output_tokens > 0:  # vLLM's timestamps of a request that produced nothing are unset (0) and its splits garbage
        first_token = max(arrival, now - max(0.0, float(finished.decode_time)))
        scheduled = max(arrival, first_token - max(0.0, float(finished.prefill_time)))
    queue, prefill, ttft = ttft_split(arrival, scheduled, first_token)
    max_tokens = getattr(finished, "max_tokens_param", None)
    return RequestRecord(
        replica_id=replica_id, request_id=str(finished.request_id or ""), trace_id="", model_name=model_name,
        workload="", arrival_time=arrival, scheduled_time=scheduled, first_token_time=first_token, finish_time=now,
        queue_seconds=queue, prefill_seconds=prefill, ttft_seconds=ttft, e2e_seconds=e2e_seconds(arrival, now),
        prompt_tokens=int(finished.num_prompt_tokens), output_tokens=output_tokens,
        cached_tokens=int(getattr(finished, "num_cached_tokens", 0) or 0),
        prompt_token_ids=[], output_token_ids=[], token_times=[],
        # only what vLLM's stats carry; the proxy's row has the request's full sampling params
        sampling_params_json=json.dumps({"max_tokens": max_tokens}) if max_tokens is not None else "{}",
        finish_reason=finish_reason_name(finished.finish_reason),
        error="corrupted output (NaNs in logits)" if getattr(finished, "is_corrupted", False) else "",
        preemptions=int(finished.num_preemptions),
    )



def engine_timing_record(request: RequestRecord) -> EngineRequestTimingRecord:
    """The engine's timing of a request (a `request_record`) for the table a proxy's row joins on:
    named with the proxy's id for it (request_ids.proxy_request_id)."""
    return EngineRequestTimingRecord(
        replica_id=request.replica_id, request_id=proxy_request_id(request.request_id),
        engine_request_id=request.request_id, model_name=request.model_name, arrival_time=request.arrival_time,
        scheduled_time=request.scheduled_time, first_token_time=request.first_token_time,
        finish_time=request.finish_time, queue_seconds=request.queue_seconds, prefill_seconds=request.prefill_seconds,
        ttft_seconds=request.ttft_seconds, e2e_seconds=request.e2e_seconds, prompt_tokens=request.prompt_tokens,
        output_tokens=request.output_tokens, cached_tokens=request.cached_tokens, preemptions=request.preemptions,
        finish_reason=request.finish_reason, error=request.error)

def _phase(prefill_seqs: int, decode_seqs: int) -> str:
    if prefill_seqs and decode_seqs:
        return "mixed"
    return "prefill" if prefill_seqs else "decode" if decode_seqs else "idle"


def step_record(scheduler_stats, iteration_stats, *, replica_id: str, step_id: int, now: float,
                kv_blocks_total: int) -> StepRecord:
    """One engine iteration (either stats may be None, not both) as a step row."""
    details = getattr(scheduler_stats, "iteration_details", None) if scheduler_stats is not None else None
    generated = int(iteration_stats.num_generation_tokens) if iteration_stats is not None else 0
    preempted = int(iteration_stats.num_preempted_reqs) if iteration_stats is not None else 0
    if details is not None:  # the batch as the engine core scheduled it
        prefill_seqs, prefill_tokens = int(details.num_ctx_requests), int(details.num_ctx_tokens)
        decode_seqs, decode_tokens = int(details.num_generation_requests), int(details.num_generation_tokens)
        duration = float(details.elapsed_ms) / 1000.0
    else:  # without iteration details: what the outputs show (prompts that completed prefill, tokens generated)
        prompts = iteration_stats.prompt_token_stats if iteration_stats is not None else None
        prefill_tokens = int(prompts.computed) if prompts is not None else 0
        prefill_seqs = len(iteration_stats.time_to_first_tokens_iter) if iteration_stats is not None else 0
        decode_seqs = len(iteration_stats.inter_token_latencies_iter) if iteration_stats is not None else 0
        decode_tokens, duration = decode_seqs, 0.0
    running = int(scheduler_stats.num_running_reqs) if scheduler_stats is not None else 0
    waiting = int(scheduler_stats.num_waiting_reqs) if scheduler_stats is not None else 0
    usage = float(scheduler_stats.kv_cache_usage) if scheduler_stats is not None else 0.0
    used = min(kv_blocks_total, round(usage * kv_blocks_total))
    prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
    return StepRecord(
        replica_id=replica_id, step_id=step_id, start_time=now - duration, duration_seconds=duration,
        phase=_phase(prefill_seqs, decode_seqs), num_seqs=prefill_seqs + decode_seqs,
        num_prefill_seqs=prefill_seqs, num_decode_seqs=decode_seqs, num_tokens=prefill_tokens + decode_tokens,
        num_prefill_tokens=prefill_tokens, num_decode_tokens=decode_tokens, num_generated_tokens=generated,
        # vLLM times the iteration as a whole (model execution): it is the forward pass here, no host split
        schedule_seconds=0.0, prepare_seconds=0.0, forward_seconds=duration, sample_seconds=0.0,
        postprocess_seconds=0.0, telemetry_seconds=0.0,
        kv_blocks_total=kv_blocks_total, kv_blocks_used=used, kv_blocks_free=kv_blocks_total - used,
        kv_blocks_cached=0,
        prefix_hit_tokens=int(prefix.hits) if prefix is not None else 0,
        prefix_query_tokens=int(prefix.queries) if prefix is not None else 0,
        evictions=0, num_waiting=waiting, num_running=running, num_preempted=preempted,
        spec_proposed=int(spec.num_draft_tokens) if spec is not None else 0,
        spec_accepted=int(spec.num_accepted_tokens) if spec is not None else 0,
        spec_accepted_per_pos=[int(n) for n in spec.num_accepted_tokens_per_pos] if spec is not None else [],
        spec_num_drafts=int(spec.num_drafts) if spec is not None else 0,
    )
