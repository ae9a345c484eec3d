"""Live `/metrics` endpoints of the real exporters, fed with real records.

The engine side is `telemetry.metrics` (MetricsObserver + the recorder-stats and
observer-failure collectors) on a private registry, served by prometheus_client's own
HTTP server; the records exercise every family, speculative decoding included.
The sidecar side is a real `infersight sidecar` process holding one active finding.
"""

from __future__ import annotations

import json
import time

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from telemetry.contract.hooks import replay_request
from telemetry.contract.records import FindingRecord, ReplicaRecord, RequestRecord, StepRecord
from telemetry.metrics import MetricsObserver, ObserverFailuresCollector, RecorderStatsCollector

T0 = 1_700_000_000.0


def replica(replica_id: str, numa_mismatch: bool = False) -> ReplicaRecord:
    return ReplicaRecord(
        replica_id=replica_id, host="h", pid=1, start_time=T0, engine_version="0.1.0",
        model_name="tiny-llama", weights_hash="w" * 16, tokenizer_hash="t" * 16,
        chat_template_hash="c" * 16, config_json="{}", config_hash="cfg1", dtype="float32",
        quantization="none", speculative_mode="draft", attention_backend="torch", device="cpu",
        numa_mismatch=numa_mismatch)


def step(i: int) -> StepRecord:
    return StepRecord(
        replica_id="r0", step_id=i, start_time=T0 + i, duration_seconds=0.01, phase="decode",
        num_seqs=2, num_prefill_seqs=0, num_decode_seqs=2, num_tokens=2, num_prefill_tokens=0,
        num_decode_tokens=2, num_generated_tokens=3, schedule_seconds=0.001, prepare_seconds=0.001,
        forward_seconds=0.007, sample_seconds=0.0005, postprocess_seconds=0.0005, telemetry_seconds=0.0,
        kv_blocks_total=64, kv_blocks_used=10, kv_blocks_free=54, kv_blocks_cached=4,
        prefix_hit_tokens=4, prefix_query_tokens=8, evictions=1, num_waiting=1, num_running=2,
        num_preempted=1, spec_proposed=6, spec_accepted=4, spec_accepted_per_pos=[2, 1, 1])


def request(i: int) -> RequestRecord:
    arrival = T0 + i
    offsets = [0.05, 0.07, 0.09]
    return RequestRecord(
        replica_id="r0", request_id=f"q{i}", trace_id="", model_name="tiny-llama", workload="chat",
        arrival_time=arrival, scheduled_time=arrival + 0.01, first_token_time=arrival + 0.05,
        finish_time=arrival + 0.09, queue_seconds=0.01, prefill_seconds=0.04, ttft_seconds=0.05,
        e2e_seconds=0.09, prompt_tokens=5, output_tokens=3, cached_tokens=4,
        prompt_token_ids=[1, 2, 3, 4, 5], output_token_ids=[6, 7, 8], token_times=offsets,
        sampling_params_json=json.dumps({"temperature": 0.0}), finish_reason="stop")


def engine_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    observer = MetricsObserver("r0", "tiny-llama", registry=registry)
    registry.register(RecorderStatsCollector(
        lambda: {t: {"written": 10, "spooled": 1, "replayed": 1, "dropped": 0} for t in ("requests", "steps")},
        "r0", "tiny-llama"))
    registry.register(ObserverFailuresCollector(lambda: 0, "r0", "tiny-llama"))
    observer.on_replica_start(replica("r0"))
    # a second replica in the same process, placed across NUMA nodes
    MetricsObserver("r1", "tiny-llama", registry=registry).on_replica_start(replica("r1", numa_mismatch=True))
    for i in range(3):
        observer.on_tokenization(cache_hit=i > 0)
        observer.on_step(step(i))
        replay_request(observer, request(i))
    return registry


def series_names(exposition: str) -> set[str]:
    """Every sample name in a text exposition (histograms as _bucket/_sum/_count)."""
    return {s.name for fam in text_string_to_metric_families(exposition) for s in fam.samples}


def engine_exposition() -> str:
    return generate_latest(engine_registry()).decode()


def serve_engine_metrics(port: int):
    """Serve a fed registry on 127.0.0.1:port; returns the server (call .shutdown())."""
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=engine_registry())
    return server


# the findings the live sidecar reports as active: alert name -> the finding's labels
LIVE_FINDINGS = {
    "InfersightRegression": {"kind": "regression", "severity": "critical", "subject": "0.1.0 -> 0.2.0",
                             "diagnostic": "regression"},
    "InfersightTokenizerDivergence": {"kind": "tokenizer_divergence", "severity": "critical",
                                      "subject": "r0 vs r2", "diagnostic": "tokenizer"},
    "InfersightQualityDrift": {"kind": "quality_drift", "severity": "warning", "subject": "int4 vs none",
                               "diagnostic": "drift"},
    "InfersightLaggingReplica": {"kind": "lagging_replica", "severity": "warning", "subject": "r3",
                                 "diagnostic": "replicas"},
    "InfersightCanaryDrift": {"kind": "probe_drift", "severity": "critical", "subject": "r1", "diagnostic": "probe"},
    "InfersightIdentityDrift": {"kind": "weights_mismatch", "severity": "critical", "subject": "r1",
                                "diagnostic": "identity"},
    "InfersightBatchVariance": {"kind": "batch_variance", "severity": "warning", "subject": "r2",
                                "diagnostic": "probe"},
    "InfersightTokenDistributionShift": {"kind": "token_distribution_shift", "severity": "warning",
                                         "subject": "r1 workload=chat", "diagnostic": "tokenizer"},
}


def start_sidecar_with_findings(data_dir):
    """A real sidecar on `data_dir` with LIVE_FINDINGS active; returns the SidecarProcess."""
    from telemetry.schema import migrate
    from telemetry.sidecar.process import start_sidecar
    from telemetry.store import open_store

    sidecar = start_sidecar(data_dir)
    try:
        with open_store(sidecar.store_url) as store:
            migrate(store)
            now = time.time()
            store.insert_records("findings", [FindingRecord(
                finding_id=f"live-{labels['kind']}", summary=f"live {labels['kind']}", window_start=now - 600,
                window_end=now, evidence_json="{}", first_seen=now - 60, last_seen=now, **labels)
                for labels in LIVE_FINDINGS.values()])
    except Exception:
        sidecar.stop()
        raise
    return sidecar
