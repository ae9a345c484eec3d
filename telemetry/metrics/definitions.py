"""The Prometheus metric families infersight exports: the registry of their names (the contract).

Every `infersight_*` name is written here once: the engine's families in `EngineMetrics`, the
counters the collectors read at scrape time, and the sidecar's families. `engine_families()` and
`SIDECAR_FAMILIES` are the lists everything else derives its own from (the dashboards' metric
contract, the alert and scrape tests); telemetry/METRICS.md documents each one.

One `EngineMetrics` per registry: several replicas in one process (tests, a local
fleet) share the families and tell themselves apart by the `replica` label.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

from telemetry.metrics import buckets, vllm_buckets
from telemetry.metrics.engine_histogram import EngineHistogram

LABELS = ("replica", "model")
# the `reason` label of request_success: the finish reasons an infersight engine gives
FINISH_REASONS = ("stop", "length", "abort", "error")
# `*_created` series would double the scrape and show up as extra gauge families in the
# text format that dashboards and alerts must not depend on (vLLM turns them off too).
disable_created_metrics()

REPLICA_INFO_LABELS = LABELS + (
    "version", "config_hash", "quantization", "speculative_mode", "attention_backend",
    "tokenizer_hash", "chat_template_hash", "numa_mismatch",
)

# counters exported by the collectors (collectors.py), not by EngineMetrics:
# Recorder.stats() key -> (metric name, help)
RECORDER_ROW_COUNTERS = {
    "written": ("infersight_telemetry_rows_written_total", "Telemetry rows the recorder stored"),
    "spooled": ("infersight_telemetry_rows_spooled_total",
                "Telemetry rows the recorder spooled to disk because the store was unreachable"),
    "replayed": ("infersight_telemetry_rows_replayed_total", "Spooled telemetry rows replayed into the store"),
    "dropped": ("infersight_telemetry_rows_dropped_total",
                "Telemetry rows dropped (buffer or spool full, unrecoverable error, "
                "or lost by an earlier run that was killed)"),
}
OBSERVER_FAILURES = "infersight_observer_failures_total"

# the sidecar's own /metrics (telemetry/sidecar/metrics.py): findings as gauges, its request counters
FINDING_ACTIVE = "infersight_finding_active"
FINDING_SEVERITY_LEVEL = "infersight_finding_severity_level"
FINDINGS = "infersight_findings_total"
SIDECAR_INSERT_ROWS = "infersight_sidecar_insert_rows_total"
SIDECAR_QUERIES = "infersight_sidecar_queries_total"
SIDECAR_ERRORS = "infersight_sidecar_errors_total"
SIDECAR_REQUEST_DURATION = "infersight_sidecar_request_duration_seconds"
SIDECAR_REJECTED = "infersight_sidecar_rejected_total"
SIDECAR_STORE_DAMAGE = "infersight_sidecar_store_damage"
SIDECAR_FAILED_WRITES = "infersight_sidecar_failed_writes_total"
SIDECAR_FAMILIES = {  # name -> type
    FINDING_ACTIVE: "gauge", FINDING_SEVERITY_LEVEL: "gauge", FINDINGS: "counter", SIDECAR_INSERT_ROWS: "counter",
    SIDECAR_QUERIES: "counter", SIDECAR_ERRORS: "counter", SIDECAR_REQUEST_DURATION: "histogram",
    SIDECAR_REJECTED: "counter", SIDECAR_STORE_DAMAGE: "gauge", SIDECAR_FAILED_WRITES: "counter",
}


class EngineMetrics:
    """Every engine-side metric family, registered on one registry."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        # registered before every family, so a scrape folds what observers deferred before it reads them
        self.before_collect = FoldDeferred()
        registry.register(self.before_collect)

        def histogram(name, doc, bounds, vllm=()):
            # lock-free: see engine_histogram.py. `vllm`: the bounds of the vLLM-named family exported from the
            # same children (vllm_names.py), kept too so that both export exact counts
            return EngineHistogram(name, doc, LABELS, bounds, registry, resolve=vllm)

        def gauge(name, doc, extra=()):
            return Gauge(name, doc, LABELS + tuple(extra), registry=registry)

        def counter(name, doc, extra=()):
            # prometheus_client appends the `_total` suffix on exposition
            return Counter(name.removesuffix("_total"), doc, LABELS + tuple(extra), registry=registry)

        # request latencies (observed once per finished request)
        self.ttft = histogram("infersight_time_to_first_token_seconds",
                              "Arrival to first output token, seconds", buckets.TTFT_SECONDS,
                              vllm_buckets.TIME_TO_FIRST_TOKEN)
        self.itl = histogram("infersight_inter_token_latency_seconds",
                             "Time between consecutive output tokens of a request, seconds", buckets.ITL_SECONDS,
                             vllm_buckets.INTER_TOKEN_LATENCY)
        self.e2e = histogram("infersight_e2e_request_latency_seconds",
                             "Arrival to finish of a request, seconds", buckets.REQUEST_SECONDS,
                             vllm_buckets.REQUEST_LATENCY)
        self.queue = histogram("infersight_request_queue_time_seconds",
                               "Arrival to first scheduled, seconds", buckets.REQUEST_SECONDS,
                               vllm_buckets.REQUEST_LATENCY)
        self.prefill = histogram("infersight_request_prefill_time_seconds",
                                 "First scheduled to first output token, seconds", buckets.REQUEST_SECONDS,
                                 vllm_buckets.REQUEST_LATENCY)
        self.decode = histogram("infersight_request_decode_time_seconds",
                                "First output token to finish, seconds", buckets.REQUEST_SECONDS,
                                vllm_buckets.REQUEST_LATENCY)
        self.request_prompt_tokens = histogram("infersight_request_prompt_tokens",
                                               "Prompt tokens per finished request", buckets.TOKENS,
                                               vllm_buckets.request_tokens(vllm_buckets.TOKENS_KEPT_UP_TO))
        self.request_generation_tokens = histogram("infersight_request_generation_tokens",
                                                   "Output tokens per finished request", buckets.TOKENS,
                                                   vllm_buckets.request_tokens(vllm_buckets.TOKENS_KEPT_UP_TO))
        # steps
        self.step_duration = histogram("infersight_step_duration_seconds",
                                       "Wall time of one scheduler step, seconds", buckets.STEP_SECONDS)
        self.host_overhead = histogram("infersight_step_host_overhead_ratio",
                                       "Share of a step's wall time spent outside the forward pass (0..1)",
                                       buckets.RATIO)
        # state
        self.running = gauge("infersight_num_requests_running", "Requests in the running batch")
        self.waiting = gauge("infersight_num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("infersight_kv_cache_usage_ratio", "KV blocks referenced by requests / all KV blocks")
        self.kv_blocks = gauge("infersight_kv_cache_blocks",
                               "KV blocks by state: used (referenced), free (not referenced, includes cached), "
                               "cached (free but holding a reusable prefix)", ("state",))
        self.replica_info = Gauge("infersight_replica_info", "Replica identity (value 1)",
                                  REPLICA_INFO_LABELS, registry=registry)
        # counters
        self.prompt_tokens = counter("infersight_prompt_tokens_total", "Prompt tokens of finished requests")
        self.generation_tokens = counter("infersight_generation_tokens_total", "Output tokens of finished requests")
        self.request_success = counter("infersight_request_success_total",
                                       "Finished requests by finish reason (stop, length, abort, error)",
                                       ("finished_reason",))
        self.preemptions = counter("infersight_num_preemptions_total", "Requests preempted (KV blocks ran out)")
        self.requests_shed = counter("infersight_requests_shed_total",
                                     "Requests shed: refused with 429 because the replica's queue was full, "
                                     "or with 503 while it cannot serve")
        self.prefix_queries = counter("infersight_prefix_cache_queries_total",
                                      "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("infersight_prefix_cache_hits_total",
                                   "Prompt tokens served from the prefix cache")
        self.evictions = counter("infersight_kv_cache_evictions_total", "Cached KV blocks evicted for reuse")
        self.spec_drafts = counter("infersight_spec_decode_num_drafts_total", "Speculative drafts proposed")
        self.spec_draft_tokens = counter("infersight_spec_decode_num_draft_tokens_total",
                                         "Speculative draft tokens proposed")
        self.spec_accepted = counter("infersight_spec_decode_num_accepted_tokens_total",
                                     "Speculative draft tokens accepted")
        self.spec_accepted_per_pos = counter("infersight_spec_decode_num_accepted_tokens_per_pos_total",
                                             "Speculative draft tokens accepted, by draft position (0 = first)",
                                             ("position",))
        self.tokenization_queries = counter("infersight_tokenization_cache_queries_total",
                                            "Prompts looked up in the tokenization cache")
        self.tokenization_hits = counter("infersight_tokenization_cache_hits_total",
                                         "Prompts served from the tokenization cache")
        # availability: requests answered without the engine (telemetry/contract/outcomes.py), by the
        # error code; the shed ones count in requests_shed, engine failures in request_success{error}
        self.requests_rejected = counter("infersight_requests_rejected_total",
                                         "Requests refused as sent (400 / 401 / 409 / 413), by reason (the error "
                                         "code: context_length, invalid_request ...)", ("reason",))
        self.requests_failed = counter("infersight_requests_failed_total",
                                       "Requests failed outside the engine's own records (a server error, an "
                                       "upstream's 5xx behind a proxy, a timeout), by reason", ("reason",))


class FoldDeferred:
    """A collector that exports nothing: at each collection it first runs every observer's `fold`
    (MetricsObserver defers its per-step work to a batch; see observer.py), so what a scrape reads
    includes every step and request hooked so far."""

    def __init__(self):
        self.folds: list = []

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        for fold in list(self.folds):
            fold()
        return []


def engine_families() -> dict[str, str]:
    """name -> type ("histogram" | "gauge" | "counter", counters with `_total`) of every family a
    replica's /metrics shows: EngineMetrics' own, read off a throwaway registry (so the list cannot
    drift from what is registered), then the collectors' counters."""
    registry = CollectorRegistry()
    EngineMetrics(registry)
    families = {f.name + ("_total" if f.type == "counter" else ""): f.type for f in registry.collect()}
    families.update({name: "counter" for name, _ in RECORDER_ROW_COUNTERS.values()})
    families[OBSERVER_FAILURES] = "counter"
    return families


_by_registry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def engine_metrics(registry: CollectorRegistry) -> EngineMetrics:
    """The registry's EngineMetrics, created on first use (registering twice would raise)."""
    with _lock:
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = _by_registry[registry] = EngineMetrics(registry)
        return metrics
