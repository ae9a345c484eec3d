"""What the live-telemetry hooks cost the engine thread, in microseconds per call.

    .venv/bin/python telemetry/benchmarks/observer_cost.py [--calls 20000]

Feeds realistic StepRecords / RequestRecords to MetricsObserver, TracingObserver
(batch processor, spans exported on its thread) and the whole build_observer
stack (guards + fan-out), best of several rounds, side by side with the no-op
observer. Compare the per-step numbers with a step's duration (a CPU decode step
of a tiny model is milliseconds; a GPU step ~10 ms): that ratio is the overhead.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telemetry.contract.hooks import NOOP_OBSERVER
from telemetry.metrics import MetricsObserver
from telemetry.contract.records import RequestRecord, StepRecord
from telemetry.replica_wiring import build_observer
from telemetry.tracing import TracingObserver

T0 = 1_700_000_000.0


def step(spec: bool) -> StepRecord:
    return StepRecord(
        replica_id="r0", step_id=1, start_time=T0, duration_seconds=0.012, phase="decode", num_seqs=32,
        num_prefill_seqs=0, num_decode_seqs=32, num_tokens=32, num_prefill_tokens=0, num_decode_tokens=32,
        num_generated_tokens=32, schedule_seconds=0.001, prepare_seconds=0.001, forward_seconds=0.009,
        sample_seconds=0.0005, postprocess_seconds=0.0005, telemetry_seconds=0.0001, kv_blocks_total=1024,
        kv_blocks_used=300, kv_blocks_free=724, kv_blocks_cached=50, prefix_hit_tokens=16, prefix_query_tokens=64,
        evictions=1, num_waiting=3, num_running=32, num_preempted=0,
        spec_proposed=128 if spec else 0, spec_accepted=70 if spec else 0,
        spec_accepted_per_pos=[30, 20, 12, 8] if spec else [],
    )


def request(output_tokens: int) -> RequestRecord:
    times = [0.05 + 0.01 * i for i in range(output_tokens)]
    return RequestRecord(
        replica_id="r0", request_id="req", trace_id="4bf92f3577b34da6a3ce929d0e0e4736", model_name="m",
        workload="chat", arrival_time=T0, scheduled_time=T0 + 0.01, first_token_time=T0 + 0.05,
        finish_time=T0 + times[-1], queue_seconds=0.01, prefill_seconds=0.04, ttft_seconds=0.05,
        e2e_seconds=times[-1], prompt_tokens=200, output_tokens=output_tokens, cached_tokens=64,
        prompt_token_ids=list(range(200)), output_token_ids=list(range(output_tokens)), token_times=times,
        sampling_params_json=json.dumps({"temperature": 0.7, "top_p": 0.9, "top_k": 40, "max_tokens": 256,
                                         "seed": 1}),
        finish_reason="length",
    )


def per_call_us(fn, arg, calls: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn(arg)
        best = min(best, (time.perf_counter_ns() - start) / calls / 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="hook calls per round (requests: / 10)")
    args = parser.parse_args()
    n, n_req = args.calls, max(1, args.calls // 10)

    metrics = MetricsObserver("r0", "m")
    plain = MetricsObserver("r0", "m", vllm_names=False)  # the infersight_* names only (serve --no-vllm-metrics)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=1 << 16))
    tracing = TracingObserver("m", "r0", tracer_provider=provider)
    stack, parts = build_observer("r0", "m", tracer_provider=provider)

    def drained(observer, us):  # let the span worker finish before the next row is timed
        observer.flush(timeout=600)
        return us

    inline = TracingObserver("m", "r0", tracer_provider=provider, background=False)
    lock = threading.Lock()
    rows = [
        ("python baseline:", "lock acquire + release", per_call_us(lambda _: (lock.acquire(), lock.release()), 0, n)),
        ("no-op observer", "on_step", per_call_us(NOOP_OBSERVER.on_step, step(False), n)),
        ("MetricsObserver", "on_step", per_call_us(metrics.on_step, step(False), n)),
        ("MetricsObserver", "on_step (speculative, 4 positions)", per_call_us(metrics.on_step, step(True), n)),
        ("MetricsObserver", "on_tokenization", per_call_us(metrics.on_tokenization, True, n)),
        ("MetricsObserver", "on_request_finished (16 tokens)", per_call_us(metrics.on_request_finished,
                                                                           request(16), n_req)),
        ("MetricsObserver", "on_request_finished (256 tokens)", per_call_us(metrics.on_request_finished,
                                                                            request(256), n_req)),
        ("MetricsObserver without vLLM names", "on_step", per_call_us(plain.on_step, step(False), n)),
        ("MetricsObserver without vLLM names", "on_request_finished (256 tokens)",
         per_call_us(plain.on_request_finished, request(256), n_req)),
        ("TracingObserver", "on_request_finished (queued)", drained(tracing, per_call_us(
            tracing.on_request_finished, request(16), n_req))),
        ("TracingObserver", "span tree build (worker thread)", per_call_us(inline.on_request_finished,
                                                                           request(16), n_req)),
        ("build_observer stack", "on_step", per_call_us(stack.on_step, step(False), n)),
        ("build_observer stack", "on_request_finished (256 tokens)", drained(parts.tracing, per_call_us(
            stack.on_request_finished, request(256), n_req))),
    ]
    parts.close()
    tracing.close()
    width = max(len(a) + len(b) for a, b, _ in rows) + 3
    print(f"{'observer / hook':<{width}} us/call")
    for who, hook, us in rows:
        print(f"{who + ' ' + hook:<{width}} {us:8.2f}")
    step_us = step(False).duration_seconds * 1e6
    stack_step = next(us for who, hook, us in rows if who.startswith("build_observer") and hook == "on_step")
    print(f"\nfull stack on_step / a {step_us / 1000:.0f} ms step: {stack_step / step_us:.4%}")


if __name__ == "__main__":
    main()
