"""Scrape a registry through the text exposition format, as Prometheus would, and look values up."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

# the engine half of the metric-name contract in COMMON.md: name -> type
CONTRACT = {
    "infersight_time_to_first_token_seconds": "histogram",
    "infersight_inter_token_latency_seconds": "histogram",
    "infersight_e2e_request_latency_seconds": "histogram",
    "infersight_request_queue_time_seconds": "histogram",
    "infersight_request_prefill_time_seconds": "histogram",
    "infersight_request_decode_time_seconds": "histogram",
    "infersight_step_duration_seconds": "histogram",
    "infersight_step_host_overhead_ratio": "histogram",
    "infersight_request_prompt_tokens": "histogram",
    "infersight_request_generation_tokens": "histogram",
    "infersight_num_requests_running": "gauge",
    "infersight_num_requests_waiting": "gauge",
    "infersight_kv_cache_usage_ratio": "gauge",
    "infersight_kv_cache_blocks": "gauge",
    "infersight_replica_info": "gauge",
    "infersight_prompt_tokens_total": "counter",
    "infersight_generation_tokens_total": "counter",
    "infersight_request_success_total": "counter",
    "infersight_num_preemptions_total": "counter",
    "infersight_prefix_cache_queries_total": "counter",
    "infersight_prefix_cache_hits_total": "counter",
    "infersight_kv_cache_evictions_total": "counter",
    "infersight_spec_decode_num_drafts_total": "counter",
    "infersight_spec_decode_num_draft_tokens_total": "counter",
    "infersight_spec_decode_num_accepted_tokens_total": "counter",
    "infersight_spec_decode_num_accepted_tokens_per_pos_total": "counter",
    "infersight_tokenization_cache_queries_total": "counter",
    "infersight_tokenization_cache_hits_total": "counter",
    "infersight_telemetry_rows_written_total": "counter",
    "infersight_telemetry_rows_spooled_total": "counter",
    "infersight_telemetry_rows_replayed_total": "counter",
    "infersight_telemetry_rows_dropped_total": "counter",
    "infersight_observer_failures_total": "counter",
}


def scrape(registry) -> dict:
    """{sample name: [(labels, value)]} plus {"__types__": {metric name: type}} from the text format."""
    out: dict = {"__types__": {}}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        name = family.name + "_total" if family.type == "counter" else family.name
        out["__types__"][name] = family.type
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(scraped, name, **labels) -> float:
    matches = [v for lbls, v in scraped.get(name, []) if all(lbls.get(k) == str(x) for k, x in labels.items())]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} samples"
    return matches[0]
