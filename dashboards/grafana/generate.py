"""The infersight Grafana dashboards, defined in Python and written as JSON next to this file.

    python -m dashboards.grafana.generate           # rewrite the *.json files
    python -m dashboards.grafana.generate --check   # exit 1 if a committed file is stale

The JSON is what Grafana loads (provisioning/ has examples); this file is where to edit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards.grafana.panels import (
    CLICKHOUSE, RATE, SEL, dashboard, prom, prometheus_variables, quantiles, sql, stat, table,
    timeseries,
)
from telemetry.contract.derived import ITL_GAPS_SQL

HERE = Path(__file__).resolve().parent
ITL = "infersight_inter_token_latency_seconds"
# which ITL the panels show: telemetry.contract.derived's per-gap definition, also the Streamlit pages'
ITL_PER_GAP = ("Per gap between consecutive output tokens of a request (a request with n tokens has n - 1), "
               "the same definition as the Streamlit dashboard's and the demo report's ITL quantiles.")
REPLICAS_UP = 'up{job="infersight-replicas", replica=~"$replica"}'
IDENTITY_LABELS = ("replica, model, version, config_hash, quantization, speculative_mode, "
                   "attention_backend, tokenizer_hash, chat_template_hash, numa_mismatch")


def rate(metric: str, by: str = "", sel: str = SEL) -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{sel}}}[{RATE}]))"


def overview() -> dict:
    h = "infersight_time_to_first_token_seconds"
    panels = [
        stat("Replicas up", prom(f"count({REPLICAS_UP} == 1) or vector(0)"),
             thresholds=[(None, "red"), (1, "green")]),
        stat("Requests / s", prom(rate("infersight_request_success_total")), unit="reqps"),
        stat("TTFT p99", quantiles(h, qs=(0.99,))[0], unit="s",
             thresholds=[(None, "green"), (2, "red")]),
        stat("ITL p99", quantiles(ITL, qs=(0.99,))[0], unit="s",
             thresholds=[(None, "green"), (0.2, "red")], description=ITL_PER_GAP),
        stat("Active findings", prom("count(infersight_finding_active == 1) or vector(0)"),
             thresholds=[(None, "green"), (1, "orange")]),
        stat("Telemetry rows dropped", prom(
            f"sum(increase(infersight_telemetry_rows_dropped_total{{{SEL}}}[$__range])) or vector(0)"),
             thresholds=[(None, "green"), (1, "red")]),
        timeseries("Requests by finish reason", [prom(rate("infersight_request_success_total", "finished_reason"),
                                                      "{{finished_reason}}")], unit="reqps", stack=True),
        timeseries("Token throughput", [
            prom(rate("infersight_prompt_tokens_total"), "prompt"),
            prom(rate("infersight_generation_tokens_total"), "generation")], unit="short"),
        timeseries("Time to first token", quantiles(h), unit="s"),
        timeseries("Inter-token latency", quantiles(ITL), unit="s", description=ITL_PER_GAP),
        timeseries("End-to-end latency", quantiles("infersight_e2e_request_latency_seconds"), unit="s"),
        timeseries("Queue time p99 by replica",
                   quantiles("infersight_request_queue_time_seconds", by="replica", qs=(0.99,)), unit="s"),
        timeseries("Running and waiting requests", [
            prom(f"sum by (replica) (infersight_num_requests_running{{{SEL}}})", "{{replica}} running"),
            prom(f"sum by (replica) (infersight_num_requests_waiting{{{SEL}}})", "{{replica}} waiting")]),
        timeseries("KV cache usage", [prom(f"max by (replica) (infersight_kv_cache_usage_ratio{{{SEL}}})",
                                           "{{replica}}")], unit="percentunit"),
        timeseries("Host overhead share of step time",
                   quantiles("infersight_step_host_overhead_ratio", qs=(0.5, 0.9)), unit="percentunit",
                   description="Share of each step spent outside the forward pass: is the GPU waiting on the host?"),
        timeseries("Telemetry rows / s by table", [
            prom(rate("infersight_telemetry_rows_written_total", "table"), "{{table}} written"),
            prom(rate("infersight_telemetry_rows_spooled_total", "table"), "{{table}} spooled"),
            prom(rate("infersight_telemetry_rows_replayed_total", "table"), "{{table}} replayed"),
            prom(rate("infersight_telemetry_rows_dropped_total", "table"), "{{table}} dropped")]),
    ]
    return dashboard("infersight-overview", "infersight / Overview", panels, prometheus_variables(),
                     "Fleet health at a glance: traffic, latency SLOs, queues, KV cache, telemetry.")


def replica_comparison() -> dict:
    per_replica = [
        ("TTFT p99 by replica", "infersight_time_to_first_token_seconds"),
        ("Inter-token latency p99 by replica", "infersight_inter_token_latency_seconds"),
        ("End-to-end latency p99 by replica", "infersight_e2e_request_latency_seconds"),
        ("Queue time p99 by replica", "infersight_request_queue_time_seconds"),
        ("Prefill time p99 by replica", "infersight_request_prefill_time_seconds"),
        ("Decode time p99 by replica", "infersight_request_decode_time_seconds"),
    ]
    panels = [
        table("Replica identity", [prom(f"max by ({IDENTITY_LABELS}) (infersight_replica_info{{{SEL}}})",
                                        instant=True, table=True)],
              description="Version, config, quantization, tokenizer and chat template per replica: "
                          "config drift shows up as differing hashes."),
        stat("Distinct configs per model", prom(
            f"max(count by (model) (count by (model, config_hash) (infersight_replica_info{{{SEL}}})))"),
             thresholds=[(None, "green"), (2, "orange")], w=6),
        stat("Distinct tokenizers per model", prom(
            f"max(count by (model) (count by (model, tokenizer_hash, chat_template_hash) "
            f"(infersight_replica_info{{{SEL}}})))"),
             thresholds=[(None, "green"), (2, "red")], w=6),
        stat("Replicas with NUMA mismatch", prom(
            f'count(infersight_replica_info{{{SEL}, numa_mismatch="true"}}) or vector(0)'),
             thresholds=[(None, "green"), (1, "orange")], w=6),
        stat("Slowest / fastest TTFT p99", prom(
            f"max(histogram_quantile(0.99, sum by (replica, le) (rate(infersight_time_to_first_token_seconds_bucket{{{SEL}}}[{RATE}])))) "
            f"/ min(histogram_quantile(0.99, sum by (replica, le) (rate(infersight_time_to_first_token_seconds_bucket{{{SEL}}}[{RATE}]))))"),
             unit="x", thresholds=[(None, "green"), (1.5, "orange")], w=6),
    ]
    panels += [timeseries(title, quantiles(metric, by="replica", qs=(0.99,)), unit="s", w=8)
               for title, metric in per_replica]
    panels += [
        timeseries("Generation tokens / s by replica",
                   [prom(rate("infersight_generation_tokens_total", "replica"), "{{replica}}")], w=8),
        timeseries("Step duration p50 by replica",
                   quantiles("infersight_step_duration_seconds", by="replica", qs=(0.5,)), unit="s", w=8),
        timeseries("Host overhead share p90 by replica",
                   quantiles("infersight_step_host_overhead_ratio", by="replica", qs=(0.9,)), unit="percentunit", w=8),
        timeseries("Prompt length p50 by replica",
                   quantiles("infersight_request_prompt_tokens", by="replica", qs=(0.5,)), w=12,
                   description="Different workloads explain different latencies: compare like with like."),
        timeseries("Generation length p50 by replica",
                   quantiles("infersight_request_generation_tokens", by="replica", qs=(0.5,)), w=12),
    ]
    return dashboard("infersight-replicas", "infersight / Replica comparison", panels, prometheus_variables(),
                     "Why is one replica slower? Identity, placement and latency side by side.")


def kv_cache() -> dict:
    panels = [
        timeseries("KV cache usage by replica", [prom(
            f"max by (replica) (infersight_kv_cache_usage_ratio{{{SEL}}})", "{{replica}}")], unit="percentunit"),
        timeseries("KV blocks by state", [prom(
            f"sum by (replica, state) (infersight_kv_cache_blocks{{{SEL}}})", "{{replica}} {{state}}")], stack=True),
        timeseries("Prefix cache hit rate", [prom(
            f'{rate("infersight_prefix_cache_hits_total", "replica")} / {rate("infersight_prefix_cache_queries_total", "replica")}',
            "{{replica}}")], unit="percentunit", description="Prompt tokens served from the prefix cache."),
        timeseries("Evictions / s", [prom(rate("infersight_kv_cache_evictions_total", "replica"), "{{replica}}")]),
        timeseries("Preemptions / s", [prom(rate("infersight_num_preemptions_total", "replica"), "{{replica}}")]),
        timeseries("Waiting requests", [prom(
            f"sum by (replica) (infersight_num_requests_waiting{{{SEL}}})", "{{replica}}")]),
        timeseries("Tokenization cache hit rate", [prom(
            f'{rate("infersight_tokenization_cache_hits_total", "replica")} / {rate("infersight_tokenization_cache_queries_total", "replica")}',
            "{{replica}}")], unit="percentunit"),
        timeseries("Cached prompt tokens / s", [
            prom(rate("infersight_prefix_cache_hits_total", "replica"), "{{replica}} hits"),
            prom(rate("infersight_prompt_tokens_total", "replica"), "{{replica}} prompt")]),
    ]
    return dashboard("infersight-kv-cache", "infersight / KV cache", panels, prometheus_variables(),
                     "Block pool usage, prefix caching, evictions and preemptions.")


def speculative_decoding() -> dict:
    drafts = rate("infersight_spec_decode_num_drafts_total", "replica")
    draft_tokens = rate("infersight_spec_decode_num_draft_tokens_total", "replica")
    accepted = rate("infersight_spec_decode_num_accepted_tokens_total", "replica")
    panels = [
        table("Speculative mode by replica", [prom(
            f"max by (replica, model, speculative_mode, version, config_hash) (infersight_replica_info{{{SEL}}})",
            instant=True, table=True)], h=6),
        timeseries("Draft acceptance rate", [prom(f"{accepted} / {draft_tokens}", "{{replica}}")],
                   unit="percentunit", description="Accepted draft tokens over proposed draft tokens."),
        timeseries("Accepted tokens per draft", [prom(f"{accepted} / {drafts}", "{{replica}}")],
                   description="Mean number of draft tokens accepted per speculation step."),
        timeseries("Acceptance rate by draft position", [prom(
            f"sum by (position) (rate(infersight_spec_decode_num_accepted_tokens_per_pos_total{{{SEL}}}[{RATE}])) "
            f"/ scalar(sum(rate(infersight_spec_decode_num_drafts_total{{{SEL}}}[{RATE}])))",
            "position {{position}}")], unit="percentunit"),
        timeseries("Drafts and draft tokens / s", [prom(drafts, "{{replica}} drafts"),
                                                   prom(draft_tokens, "{{replica}} draft tokens")]),
        timeseries("Generation tokens / s", [prom(rate("infersight_generation_tokens_total", "replica"),
                                                  "{{replica}}")]),
        timeseries("Inter-token latency p50 by replica",
                   quantiles(ITL, by="replica", qs=(0.5,)), unit="s", description=ITL_PER_GAP),
    ]
    return dashboard("infersight-speculative", "infersight / Speculative decoding", panels,
                     prometheus_variables(), "Does speculation pay? Acceptance, per-position acceptance, speed.")


def findings() -> dict:
    finding = "infersight_finding_active"
    active = f"{finding} == 1"
    panels = [
        stat("Critical findings", prom(f'count({finding}{{severity="critical"}} == 1) or vector(0)'),
             thresholds=[(None, "green"), (1, "red")], w=6),
        stat("Warnings", prom(f'count({finding}{{severity="warning"}} == 1) or vector(0)'),
             thresholds=[(None, "green"), (1, "orange")], w=6),
        stat("Sidecar up", prom('min(up{job="infersight-sidecar"}) or vector(0)'),
             thresholds=[(None, "red"), (1, "green")], w=6),
        stat("Sidecar errors / s", prom("sum(rate(infersight_sidecar_errors_total[$__rate_interval])) or vector(0)"),
             thresholds=[(None, "green"), (0.01, "red")], w=6),
        table("Active findings", [prom(f"max by (kind, severity, subject, diagnostic) ({active})",
                                       instant=True, table=True)],
              description="Details, evidence and token IDs: the Streamlit dashboard's Findings page."),
        timeseries("Active findings by kind", [prom(f"count by (kind) ({active})", "{{kind}}")], stack=True),
        timeseries("Highest severity by kind (0 info, 1 warning, 2 critical)", [prom(
            "max by (kind) (infersight_finding_severity_level)", "{{kind}}")]),
        timeseries("New findings per hour", [prom(
            "sum by (kind, severity) (increase(infersight_findings_total[1h]))", "{{kind}} {{severity}}")]),
        timeseries("Sidecar inserts (rows / s by table)", [prom(
            "sum by (table) (rate(infersight_sidecar_insert_rows_total[$__rate_interval]))", "{{table}}")]),
        timeseries("Sidecar queries and errors / s", [
            prom("sum(rate(infersight_sidecar_queries_total[$__rate_interval]))", "queries"),
            prom("sum(rate(infersight_sidecar_errors_total[$__rate_interval]))", "errors")]),
        timeseries("Sidecar request duration", quantiles(
            "infersight_sidecar_request_duration_seconds", qs=(0.5, 0.99), sel=""), unit="s"),
    ]
    return dashboard("infersight-findings", "infersight / Findings", panels, prometheus_variables(),
                     "What the diagnostics concluded, and the sidecar's own health.")


def clickhouse_deep_dive() -> dict:
    """Deep dives over the store itself: through the sidecar's ClickHouse HTTP endpoint
    (its read-only user) or a real ClickHouse cluster with the same schema."""
    replicas = "replica_id IN (${replica:singlequote})"
    panels = [
        table("Replicas: identity and placement", [sql("""
SELECT replica_id, host, engine_version, model_name, quantization, speculative_mode,
       attention_backend, device, cpu_affinity, cpu_numa_nodes, mem_policy_nodes, gpu_numa_node,
       numa_mismatch, config_hash, tokenizer_hash, chat_template_hash, start_time
FROM replicas
WHERE replica_id IN (${replica:singlequote})
ORDER BY start_time DESC
LIMIT 100""")], hide=()),
        timeseries("TTFT p99 per replica (from requests)", [sql(f"""
SELECT $__timeInterval(arrival_time) AS time, replica_id, quantile(0.99)(ttft_seconds) AS ttft_p99
FROM requests
WHERE $__timeFilter(arrival_time) AND {replicas} AND first_token_time > 0
GROUP BY time, replica_id
ORDER BY time""", table=False)], unit="s", ds=CLICKHOUSE),
        timeseries("Host time against forward time (from steps)", [sql(f"""
SELECT $__timeInterval(start_time) AS time,
       sum(forward_seconds) AS forward,
       sum(duration_seconds - forward_seconds) AS host
FROM steps
WHERE $__timeFilter(start_time) AND {replicas}
GROUP BY time
ORDER BY time""", table=False)], unit="s", stack=True, ds=CLICKHOUSE),
        table("Slowest requests", [sql(f"""
SELECT arrival_time, replica_id, request_id, trace_id, workload, finish_reason,
       ttft_seconds, e2e_seconds, queue_seconds, prompt_tokens, output_tokens, cached_tokens, preemptions
FROM requests
WHERE $__timeFilter(arrival_time) AND {replicas} AND e2e_seconds >= ${{min_e2e:raw}}
ORDER BY e2e_seconds DESC
LIMIT 50""")], hide=()),
        table("Request: token IDs and per-token timing", [sql(f"""
SELECT request_id, replica_id, finish_reason, prompt_token_ids, output_token_ids,
       token_times, {ITL_GAPS_SQL} AS inter_token_seconds, sampling_params_json
FROM requests
WHERE request_id = ${{request_id:sqlstring}}
LIMIT 1""")], hide=()),
        table("Request: the steps it took part in", [sql("""
WITH (SELECT tuple(replica_id, arrival_time, finish_time) FROM requests
      WHERE request_id = ${request_id:sqlstring} LIMIT 1) AS r
SELECT step_id, start_time, phase, num_seqs, num_tokens, duration_seconds, forward_seconds,
       schedule_seconds + prepare_seconds + sample_seconds + postprocess_seconds AS host_seconds,
       kv_blocks_used, kv_blocks_total, num_waiting, num_running, num_preempted
FROM steps
WHERE replica_id = r.1 AND start_time >= r.2 AND start_time <= r.3
ORDER BY start_time
LIMIT 1000""")], hide=()),
        table("Same prompt, different tokens across replicas", [sql("""
SELECT prompt_text_hash, uniqExact(prompt_token_ids) AS tokenizations,
       groupUniqArray(replica_id) AS replicas, count() AS requests, any(prompt_token_ids) AS example_ids
FROM requests
WHERE $__timeFilter(arrival_time) AND prompt_text_hash != ''
GROUP BY prompt_text_hash
HAVING tokenizations > 1
ORDER BY requests DESC
LIMIT 50""")], hide=(), description="A tokenizer or chat-template divergence: the same prompt text "
                                     "became different token IDs on different replicas."),
        table("Findings", [sql("""
SELECT finding_id, argMax(kind, last_seen) AS kind, argMax(severity, last_seen) AS severity,
       argMax(subject, last_seen) AS subject, argMax(summary, last_seen) AS summary,
       argMax(evidence_json, last_seen) AS evidence_json,
       min(first_seen) AS first_seen_at, max(last_seen) AS last_seen_at
FROM findings
WHERE $__timeFilter(last_seen)
GROUP BY finding_id
ORDER BY last_seen_at DESC
LIMIT 100""")], hide=()),
    ]
    variables = [
        {"name": "datasource", "label": "ClickHouse", "type": "datasource",
         "query": "grafana-clickhouse-datasource", "current": {}, "hide": 0},
        {"name": "replica", "label": "Replica", "type": "query", "datasource": CLICKHOUSE,
         "query": "SELECT DISTINCT replica_id FROM replicas ORDER BY replica_id",
         "refresh": 2, "multi": True, "includeAll": True, "current": {"text": "All", "value": "$__all"}},
        {"name": "request_id", "label": "Request ID", "type": "textbox", "query": "", "current": {"value": ""}},
        {"name": "min_e2e", "label": "Min e2e (s)", "type": "custom", "query": "0,1,2,5,10",
         "current": {"text": "0", "value": "0"}},
    ]
    return dashboard("infersight-clickhouse", "infersight / Deep dive (ClickHouse)", panels, variables,
                     "Requests, token IDs, steps and findings straight from the store.", time_from="now-24h")


DASHBOARDS = {
    "overview.json": overview,
    "replica_comparison.json": replica_comparison,
    "kv_cache.json": kv_cache,
    "speculative_decoding.json": speculative_decoding,
    "findings.json": findings,
    "clickhouse_deep_dive.json": clickhouse_deep_dive,
}


def render(build) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed JSON file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = HERE / name, render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale (run python -m dashboards.grafana.generate):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
