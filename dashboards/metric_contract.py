"""The Prometheus metric names infersight exports: the contract dashboards and alerts use.

Mirrors the list in the project's shared contract (engine: `telemetry.metrics`; sidecar:
findings and its own health). Dashboards and alert rules may use these names only; the
tests cross-check them against a live `/metrics` scrape where the exporters are available.
"""

from __future__ import annotations

ENGINE_HISTOGRAMS = (
    "infersight_time_to_first_token_seconds",
    "infersight_inter_token_latency_seconds",
    "infersight_e2e_request_latency_seconds",
    "infersight_request_queue_time_seconds",
    "infersight_request_prefill_time_seconds",
    "infersight_request_decode_time_seconds",
    "infersight_step_duration_seconds",
    "infersight_step_host_overhead_ratio",
    "infersight_request_prompt_tokens",
    "infersight_request_generation_tokens",
)
ENGINE_GAUGES = (
    "infersight_num_requests_running",
    "infersight_num_requests_waiting",
    "infersight_kv_cache_usage_ratio",
    "infersight_kv_cache_blocks",
    "infersight_replica_info",
)
ENGINE_COUNTERS = (
    "infersight_prompt_tokens_total",
    "infersight_generation_tokens_total",
    "infersight_request_success_total",
    "infersight_num_preemptions_total",
    "infersight_prefix_cache_queries_total",
    "infersight_prefix_cache_hits_total",
    "infersight_kv_cache_evictions_total",
    "infersight_spec_decode_num_drafts_total",
    "infersight_spec_decode_num_draft_tokens_total",
    "infersight_spec_decode_num_accepted_tokens_total",
    "infersight_spec_decode_num_accepted_tokens_per_pos_total",
    "infersight_tokenization_cache_queries_total",
    "infersight_tokenization_cache_hits_total",
    "infersight_telemetry_rows_written_total",
    "infersight_telemetry_rows_spooled_total",
    "infersight_telemetry_rows_replayed_total",
    "infersight_telemetry_rows_dropped_total",
    "infersight_observer_failures_total",
)
SIDECAR_GAUGES = ("infersight_finding_active", "infersight_finding_severity_level")
SIDECAR_COUNTERS = (
    "infersight_findings_total",
    "infersight_sidecar_insert_rows_total",
    "infersight_sidecar_queries_total",
    "infersight_sidecar_errors_total",
)
SIDECAR_HISTOGRAMS = ("infersight_sidecar_request_duration_seconds",)

# Prometheus' own per-target metric: `up{job="infersight-replicas"} == 0` is a replica down.
PROMETHEUS_BUILTINS = ("up",)

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def series_names(histograms=(), gauges=(), counters=()) -> set[str]:
    """The series names a scrape shows for these metrics (histograms expand to _bucket/_sum/_count)."""
    names = set(gauges) | set(counters)
    names |= {h + s for h in histograms for s in HISTOGRAM_SUFFIXES}
    return names


ENGINE_SERIES = series_names(ENGINE_HISTOGRAMS, ENGINE_GAUGES, ENGINE_COUNTERS)
SIDECAR_SERIES = series_names(SIDECAR_HISTOGRAMS, SIDECAR_GAUGES, SIDECAR_COUNTERS)
ALL_SERIES = ENGINE_SERIES | SIDECAR_SERIES | set(PROMETHEUS_BUILTINS)
