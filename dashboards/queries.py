"""Every SQL statement the Streamlit dashboard runs, in one place.

Rules: parameters are bound server-side with ClickHouse's `{name:Type}` syntax, never
formatted into the text; aggregation happens in ClickHouse (quantiles, toStartOfInterval)
and every row-returning query has a LIMIT, so a page costs the same with 1K or 1M requests.

Conventions for the parameters most queries share:
- `start`, `end`: the time window as float epoch seconds (half-open [start, end));
- `replicas`: Array(String) of replica ids, empty = all replicas;
- `bucket_ms`: the width of one time bucket in milliseconds.
"""

from __future__ import annotations

from telemetry.contract import derived, outcomes

# the definitions (window, replica filter, ITL, quantile set, latest replica start) are
# telemetry.contract.derived's, shared with diagnostics, the demo report and the metrics
REPLICA_FILTER = derived.REPLICA_FILTER_SQL
REQUEST_WINDOW = derived.window_sql("arrival_time")
STEP_WINDOW = derived.window_sql("start_time")
TTFT = derived.TTFT_QUANTILES_SQL
# per-gap ITL quantiles: the same numbers as Prometheus' inter-token-latency histogram and the demo report
ITL = derived.ITL_PER_GAP_QUANTILES_SQL
# over the requests the engine had: a refused request's e2e is the refusal's microseconds
E2E = derived.quantiles_sql("e2e_seconds", outcomes.ENGINE_HAD_SQL)
REPLICA_COLUMNS = ("host", "pid", "engine_version", "model_name", "dtype", "quantization", "speculative_mode",
                   "attention_backend", "device", "cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes",
                   "gpu_numa_node", "numa_mismatch", "config_hash", "weights_hash", "tokenizer_hash",
                   "chat_template_hash", "labels_json")
GROUP_COLUMNS = ("engine_version", "config_hash", "quantization", "speculative_mode", "model_name")

# -- window and fleet ------------------------------------------------------------------------------

DATA_RANGE = """
SELECT count() AS requests, min(arrival_time) AS first, max(arrival_time) AS last
FROM requests
"""

# each replica as of its latest start
REPLICAS_LATEST = f"""
SELECT replica_id, started AS start_time, {', '.join(REPLICA_COLUMNS)}
FROM ({derived.latest_starts_sql(REPLICA_COLUMNS)})
ORDER BY start_time DESC
LIMIT 1000
"""

# how each request ended (telemetry/contract/outcomes.py): answered, rejected, shed, failed, timed_out, aborted
REPLICA_HEALTH = f"""
SELECT replica_id,
       count() AS requests,
       {outcomes.outcome_counts_sql()},
       {TTFT} AS ttft,
       {ITL} AS itl,
       {E2E} AS e2e,
       sum(output_tokens) AS generated_tokens,
       max(finish_time) AS last_finish
FROM requests
WHERE {REQUEST_WINDOW} AND {REPLICA_FILTER}
GROUP BY replica_id
ORDER BY replica_id
LIMIT 1000
"""

LATENCY_OVER_TIME = f"""
SELECT toStartOfInterval(arrival_time, toIntervalMillisecond({{bucket_ms:UInt32}})) AS t,
       replica_id,
       count() AS requests,
       {TTFT} AS ttft,
       {ITL} AS itl,
       {E2E} AS e2e
FROM requests
WHERE {REQUEST_WINDOW} AND {REPLICA_FILTER}
GROUP BY t, replica_id
ORDER BY t, replica_id
LIMIT 20000
"""

OPEN_FINDINGS_BY_SUBJECT = """
SELECT subject, count() AS findings, groupUniqArray(kind) AS kinds,
       countIf(severity = 'critical') AS critical, countIf(severity = 'warning') AS warning
FROM (SELECT finding_id, argMax(subject, last_seen) AS subject, argMax(kind, last_seen) AS kind,
             argMax(severity, last_seen) AS severity
      FROM findings GROUP BY finding_id)
GROUP BY subject
LIMIT 1000
"""

# -- requests --------------------------------------------------------------------------------------

_SEARCH = f"""
SELECT arrival_time, replica_id, request_id, trace_id, workload, finish_reason, http_status, error_code,
       ttft_seconds, e2e_seconds, queue_seconds, prompt_tokens, output_tokens, cached_tokens,
       preemptions, error
FROM requests
WHERE {REQUEST_WINDOW} AND {REPLICA_FILTER}
  AND (empty({{workloads:Array(String)}}) OR has({{workloads:Array(String)}}, workload))
  AND (empty({{reasons:Array(String)}}) OR has({{reasons:Array(String)}}, finish_reason))
  AND e2e_seconds >= {{min_e2e:Float64}}
  -- a TTFT the writer could not measure (nan) only fails a minimum that was asked for
  AND (ttft_seconds >= {{min_ttft:Float64}} OR ({{min_ttft:Float64}} <= 0 AND NOT isFinite(ttft_seconds)))
  AND ({{search:String}} = '' OR startsWith(request_id, {{search:String}}) OR trace_id = {{search:String}})
ORDER BY {{order}}
LIMIT {{limit:UInt32}}
"""
# the sort order is picked from this fixed list, never from user text
SEARCH_ORDERS = {
    "slowest end-to-end": "e2e_seconds DESC",
    "slowest first token": "ttft_seconds DESC",
    "newest": "arrival_time DESC",
    "oldest": "arrival_time ASC",
    "longest prompt": "prompt_tokens DESC",
}
SEARCH_REQUESTS = {name: _SEARCH.replace("{order}", clause) for name, clause in SEARCH_ORDERS.items()}

WORKLOADS_AND_REASONS = f"""
SELECT groupUniqArray(100)(workload) AS workloads, groupUniqArray(100)(finish_reason) AS reasons
FROM requests
WHERE {REQUEST_WINDOW}
"""

REQUEST_DETAIL = """
SELECT *
FROM requests
WHERE request_id = {request_id:String}
ORDER BY arrival_time DESC
LIMIT 1
"""

# the identity a replica served a request with: its latest start at or before `at` (else its latest),
# for the model directory (config_json's "model") and the tokenizer hash the dashboard decodes with
REPLICA_IDENTITY_AT = """
SELECT replica_id, model_name, tokenizer_hash, config_json
FROM replicas
WHERE replica_id = {replica_id:String}
ORDER BY start_time <= toDateTime64({at:Float64}, 6, 'UTC') DESC, start_time DESC
LIMIT 1
"""

# what the engine itself measured of the request, where a proxy wrote its row (vLLM's plugin behind
# `infersight proxy`: telemetry.contract.derived.ENGINE_TIMING_JOIN_SQL)
ENGINE_TIMING = """
SELECT e.engine_request_id AS engine_request_id, e.queue_seconds AS queue_seconds,
       e.prefill_seconds AS prefill_seconds, e.ttft_seconds AS ttft_seconds, e.e2e_seconds AS e2e_seconds,
       t.ttft_seconds - e.ttft_seconds AS before_engine_seconds, e.cached_tokens AS cached_tokens,
       e.preemptions AS preemptions, e.finish_reason AS finish_reason
FROM (SELECT * FROM requests WHERE request_id = {request_id:String} ORDER BY arrival_time DESC LIMIT 1) AS t
""" + derived.ENGINE_TIMING_JOIN_SQL + """
WHERE e.request_id != ''
LIMIT 1
"""

# the steps a request took part in: its replica's steps that started during its lifetime
REQUEST_STEPS = """
WITH (SELECT tuple(replica_id, arrival_time, finish_time) FROM requests
      WHERE request_id = {request_id:String} ORDER BY arrival_time DESC LIMIT 1) AS r
SELECT step_id, start_time, phase, num_seqs, num_tokens, num_prefill_tokens, num_decode_tokens,
       num_generated_tokens, duration_seconds, forward_seconds,
       duration_seconds - forward_seconds AS host_seconds,
       kv_blocks_used, kv_blocks_total, num_waiting, num_running, num_preempted
FROM steps
WHERE replica_id = r.1 AND start_time >= r.2 AND start_time <= r.3
ORDER BY start_time
LIMIT 2000
"""

# -- compare ---------------------------------------------------------------------------------------

# which replicas share a version / config: the Compare page's groups
REPLICA_GROUPS = f"""
SELECT replica_id, {', '.join(GROUP_COLUMNS)}
FROM ({derived.latest_starts_sql(GROUP_COLUMNS)})
ORDER BY started DESC
LIMIT 1000
"""

COMPARE_SUMMARY = f"""
SELECT if(has({{a:Array(String)}}, replica_id), 'A', 'B') AS side,
       count() AS requests,
       {outcomes.outcome_counts_sql()},
       {TTFT} AS ttft,
       {ITL} AS itl,
       {E2E} AS e2e,
       {derived.quantiles_sql('queue_seconds', derived.known_sql('queue_seconds'))} AS queue,
       avgIf(prompt_tokens, {outcomes.ENGINE_HAD_SQL}) AS mean_prompt_tokens,
       avgIf(output_tokens, {outcomes.ENGINE_HAD_SQL}) AS mean_output_tokens
FROM requests
WHERE {REQUEST_WINDOW} AND (has({{a:Array(String)}}, replica_id) OR has({{b:Array(String)}}, replica_id))
GROUP BY side
ORDER BY side
LIMIT 2
"""

# the TTFT distribution of each side as 99 quantiles (a quantile plot instead of raw rows)
COMPARE_TTFT_CURVE = f"""
SELECT if(has({{a:Array(String)}}, replica_id), 'A', 'B') AS side,
       {derived.quantiles_sql('ttft_seconds', derived.TTFT_KNOWN_SQL, [q / 100 for q in range(1, 100)])} AS q
FROM requests
WHERE {REQUEST_WINDOW} AND (has({{a:Array(String)}}, replica_id) OR has({{b:Array(String)}}, replica_id))
GROUP BY side
ORDER BY side
LIMIT 2
"""

# -- scheduler -------------------------------------------------------------------------------------

STEP_TIMELINE = f"""
SELECT toStartOfInterval(start_time, toIntervalMillisecond({{bucket_ms:UInt32}})) AS t,
       count() AS steps,
       avg(num_seqs) AS batch_size,
       max(num_seqs) AS max_batch_size,
       sum(num_prefill_tokens) AS prefill_tokens,
       sum(num_decode_tokens) AS decode_tokens,
       sum(forward_seconds) AS forward_time,
       sum(duration_seconds - forward_seconds) AS host_time,
       avg(num_waiting) AS waiting,
       avg(num_running) AS running,
       max(num_waiting) AS max_waiting
FROM steps
WHERE {STEP_WINDOW} AND replica_id = {{replica:String}}
GROUP BY t
ORDER BY t
LIMIT 20000
"""

STEP_TIME_SPLIT = f"""
SELECT count() AS steps,
       sum(duration_seconds) AS total,
       sum(schedule_seconds) AS schedule,
       sum(prepare_seconds) AS prepare,
       sum(forward_seconds) AS forward,
       sum(sample_seconds) AS sample,
       sum(postprocess_seconds) AS postprocess,
       sum(telemetry_seconds) AS telemetry,
       countIf(phase = 'prefill') AS prefill_steps,
       countIf(phase = 'decode') AS decode_steps,
       countIf(phase = 'mixed') AS mixed_steps
FROM steps
WHERE {STEP_WINDOW} AND replica_id = {{replica:String}}
"""

RECENT_STEPS = f"""
SELECT step_id, start_time, phase, num_seqs, num_tokens, num_prefill_tokens, num_decode_tokens,
       duration_seconds, forward_seconds, duration_seconds - forward_seconds AS host_seconds,
       num_waiting, num_running, num_preempted
FROM steps
WHERE {STEP_WINDOW} AND replica_id = {{replica:String}}
ORDER BY start_time DESC
LIMIT 200
"""

STEP_REPLICAS = f"""
SELECT replica_id, count() AS steps
FROM steps
WHERE {STEP_WINDOW}
GROUP BY replica_id
ORDER BY replica_id
LIMIT 1000
"""

# -- KV cache --------------------------------------------------------------------------------------

KV_TIMELINE = f"""
SELECT toStartOfInterval(start_time, toIntervalMillisecond({{bucket_ms:UInt32}})) AS t,
       replica_id,
       avg(kv_blocks_used / kv_blocks_total) AS utilization,
       max(kv_blocks_used / kv_blocks_total) AS max_utilization,
       avg(kv_blocks_cached / kv_blocks_total) AS cached_share,
       sum(prefix_hit_tokens) AS prefix_hit_tokens,
       sum(prefix_query_tokens) AS prefix_query_tokens,
       sum(evictions) AS evictions,
       sum(num_preempted) AS preemptions
FROM steps
WHERE {STEP_WINDOW} AND {REPLICA_FILTER} AND kv_blocks_total > 0
GROUP BY t, replica_id
ORDER BY t, replica_id
LIMIT 20000
"""

KV_SUMMARY = f"""
SELECT replica_id,
       any(kv_blocks_total) AS blocks,
       avg(kv_blocks_used / kv_blocks_total) AS mean_utilization,
       max(kv_blocks_used / kv_blocks_total) AS peak_utilization,
       sum(prefix_hit_tokens) / greatest(sum(prefix_query_tokens), 1) AS prefix_hit_rate,
       sum(evictions) AS evictions,
       sum(num_preempted) AS preemptions
FROM steps
WHERE {STEP_WINDOW} AND {REPLICA_FILTER} AND kv_blocks_total > 0
GROUP BY replica_id
ORDER BY replica_id
LIMIT 1000
"""

# -- evals -----------------------------------------------------------------------------------------

EVAL_RUNS = """
SELECT run_id, suite, start_time, finish_time, model_name, quantization, speculative_mode,
       config_hash, git_sha, num_items, accuracy, endpoint, notes
FROM eval_runs
ORDER BY start_time DESC
LIMIT 500
"""

EVAL_TASK_ACCURACY = """
SELECT run_id, task, count() AS items, avg(score) AS accuracy
FROM eval_items
WHERE run_id IN ({base:String}, {candidate:String})
GROUP BY run_id, task
ORDER BY task, run_id
LIMIT 1000
"""

# one row per item of either run: both scores side by side, the changed ones first
EVAL_ITEM_DRIFT = """
SELECT item_id,
       any(task) AS task,
       anyIf(score, run_id = {base:String}) AS base_score,
       anyIf(score, run_id = {candidate:String}) AS candidate_score,
       candidate_score - base_score AS delta,
       anyIf(output_token_ids, run_id = {base:String}) != anyIf(output_token_ids, run_id = {candidate:String})
           AS output_changed,
       countIf(run_id = {base:String}) > 0 AND countIf(run_id = {candidate:String}) > 0 AS in_both
FROM eval_items
WHERE run_id IN ({base:String}, {candidate:String})
GROUP BY item_id
ORDER BY abs(delta) DESC, output_changed DESC, item_id
LIMIT 1000
"""

EVAL_ITEM_PAIR = """
SELECT run_id, item_id, task, scorer, score, reference, output_text, input_token_ids,
       output_token_ids, output_logprobs
FROM eval_items
WHERE run_id IN ({base:String}, {candidate:String}) AND item_id = {item_id:String}
LIMIT 2
"""

# -- findings --------------------------------------------------------------------------------------

FINDINGS = """
SELECT finding_id,
       argMax(kind, last_seen) AS kind,
       argMax(severity, last_seen) AS severity,
       argMax(subject, last_seen) AS subject,
       argMax(summary, last_seen) AS summary,
       argMax(diagnostic, last_seen) AS diagnostic,
       argMax(window_start, last_seen) AS window_start,
       argMax(window_end, last_seen) AS window_end,
       min(first_seen) AS first_seen_at,
       max(last_seen) AS last_seen_at
FROM findings
GROUP BY finding_id
HAVING (empty({kinds:Array(String)}) OR has({kinds:Array(String)}, kind))
   AND (empty({severities:Array(String)}) OR has({severities:Array(String)}, severity))
ORDER BY multiIf(severity = 'critical', 0, severity = 'warning', 1, 2), last_seen_at DESC
LIMIT 500
"""

FINDING_KINDS = """
SELECT groupUniqArray(kind) AS kinds, groupUniqArray(severity) AS severities FROM findings
"""

FINDING_EVIDENCE = """
SELECT argMax(evidence_json, last_seen) AS evidence_json
FROM findings
WHERE finding_id = {finding_id:String}
"""

# a lagging-replica finding's metric, per replica of its window: 99 quantiles (the distribution as a curve);
# the metric definitions are diagnostics.request_strata's (completed requests that produced a token)
DISTRIBUTION_LEVELS = tuple(round(k / 100, 2) for k in range(1, 100))
FINDING_LATENCY_DISTRIBUTION = f"""
SELECT replica_id, count() AS requests, {derived.quantiles_sql("value", levels=DISTRIBUTION_LEVELS)} AS q
FROM (SELECT replica_id,
             multiIf({{metric:String}} = 'queue', queue_seconds, {{metric:String}} = 'prefill', prefill_seconds,
                     {{metric:String}} = 'ttft', ttft_seconds, {{metric:String}} = 'tpot', {derived.TPOT_SQL},
                     {{metric:String}} = 'itl', {derived.mean_itl_sql("token_times")}, e2e_seconds) AS value
      FROM requests
      WHERE {REQUEST_WINDOW} AND {REPLICA_FILTER} AND finish_reason NOT IN ('abort', 'error') AND output_tokens > 0)
WHERE isFinite(value)
GROUP BY replica_id
ORDER BY replica_id
LIMIT 1000
"""

# -- profiles --------------------------------------------------------------------------------------

PROFILES = f"""
SELECT profile_id, replica_id, any(pid) AS pid, min(start_time) AS start_time,
       max(duration_seconds) AS duration_seconds, sum(samples) AS samples
FROM profiles
WHERE {REPLICA_FILTER}
GROUP BY profile_id, replica_id
ORDER BY start_time DESC
LIMIT 500
"""

PROFILE_STACKS = """
SELECT stack, sum(samples) AS samples
FROM profiles
WHERE profile_id = {profile_id:String}
GROUP BY stack
ORDER BY samples DESC
LIMIT 5000
"""

PROFILE_GROUPS = """
SELECT `group`, sum(samples) AS samples
FROM profiles
WHERE profile_id = {profile_id:String}
GROUP BY `group`
ORDER BY samples DESC
LIMIT 100
"""
