-- 0001: the tables of telemetry/records.py, column for column, in record order.
--
-- Conventions (Langfuse v3 / OpenTelemetry ClickHouse exporter style):
-- * MergeTree for immutable rows; ReplacingMergeTree only where a row is updated (findings);
-- * PARTITION BY the day of the main time column, ORDER BY low-cardinality dimensions then time;
-- * instants are DateTime64(6, 'UTC') (records carry float epoch seconds; the writer converts);
-- * codecs: DoubleDelta for the sorted time column, Delta for other instants and counters that
--   move slowly, T64 for small integers, ZSTD behind all of them;
-- * bloom filters on the ids people search by (request_id, trace_id, run_id ...);
-- * a table TTL, and a shorter column TTL on any stored prompt or output text;
-- * non_replicated_deduplication_window: insert_deduplication_token also works on plain
--   MergeTree, so a retried batch is stored once (the cluster variant uses the replicated window).
-- The cluster variant (ON CLUSTER, Replicated*, Distributed) is rendered from this same file by
-- telemetry.schema.render(cluster=...). Statements end with ';' at the end of a line.

CREATE TABLE IF NOT EXISTS replicas
(
    replica_id LowCardinality(String),
    host LowCardinality(String),
    pid UInt32 CODEC(T64, ZSTD(1)),
    start_time DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    engine_version LowCardinality(String),
    model_name LowCardinality(String),
    weights_hash LowCardinality(String),
    tokenizer_hash LowCardinality(String),
    chat_template_hash LowCardinality(String),
    config_json String CODEC(ZSTD(3)),
    config_hash LowCardinality(String),
    dtype LowCardinality(String),
    quantization LowCardinality(String),
    speculative_mode LowCardinality(String),
    attention_backend LowCardinality(String),
    device LowCardinality(String),
    cpu_affinity Array(UInt32) CODEC(ZSTD(1)),
    cpu_numa_nodes Array(UInt32) CODEC(ZSTD(1)),
    mem_policy_nodes Array(UInt32) CODEC(ZSTD(1)),
    gpu_numa_node Int32 CODEC(T64, ZSTD(1)),
    numa_mismatch Bool,
    labels_json String CODEC(ZSTD(3))
)
ENGINE = MergeTree
PARTITION BY toDate(start_time)
ORDER BY (model_name, replica_id, start_time)
TTL toDateTime(start_time) + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS requests
(
    replica_id LowCardinality(String),
    request_id String CODEC(ZSTD(1)),
    trace_id String CODEC(ZSTD(1)),
    model_name LowCardinality(String),
    workload LowCardinality(String),
    arrival_time DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    scheduled_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    first_token_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    finish_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    queue_seconds Float64 CODEC(ZSTD(1)),
    prefill_seconds Float64 CODEC(ZSTD(1)),
    ttft_seconds Float64 CODEC(ZSTD(1)),
    e2e_seconds Float64 CODEC(ZSTD(1)),
    prompt_tokens UInt32 CODEC(T64, ZSTD(1)),
    output_tokens UInt32 CODEC(T64, ZSTD(1)),
    cached_tokens UInt32 CODEC(T64, ZSTD(1)),
    prompt_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    output_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    token_times Array(Float32) CODEC(ZSTD(1)),
    sampling_params_json String CODEC(ZSTD(3)),
    finish_reason LowCardinality(String),
    error String CODEC(ZSTD(3)),
    preemptions UInt32 CODEC(T64, ZSTD(1)),
    spec_proposed UInt32 CODEC(T64, ZSTD(1)),
    spec_accepted UInt32 CODEC(T64, ZSTD(1)),
    prompt_text_hash String CODEC(ZSTD(1)),
    prompt_text String CODEC(ZSTD(3)) TTL toDateTime(arrival_time) + INTERVAL 7 DAY,
    output_text String CODEC(ZSTD(3)) TTL toDateTime(arrival_time) + INTERVAL 7 DAY,
    INDEX idx_request_id request_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_trace_id trace_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_prompt_text_hash prompt_text_hash TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(arrival_time)
ORDER BY (model_name, workload, replica_id, arrival_time)
TTL toDateTime(arrival_time) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS steps
(
    replica_id LowCardinality(String),
    step_id UInt64 CODEC(Delta, ZSTD(1)),
    start_time DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    duration_seconds Float64 CODEC(ZSTD(1)),
    phase LowCardinality(String),
    num_seqs UInt32 CODEC(T64, ZSTD(1)),
    num_prefill_seqs UInt32 CODEC(T64, ZSTD(1)),
    num_decode_seqs UInt32 CODEC(T64, ZSTD(1)),
    num_tokens UInt32 CODEC(T64, ZSTD(1)),
    num_prefill_tokens UInt32 CODEC(T64, ZSTD(1)),
    num_decode_tokens UInt32 CODEC(T64, ZSTD(1)),
    num_generated_tokens UInt32 CODEC(T64, ZSTD(1)),
    schedule_seconds Float64 CODEC(ZSTD(1)),
    prepare_seconds Float64 CODEC(ZSTD(1)),
    forward_seconds Float64 CODEC(ZSTD(1)),
    sample_seconds Float64 CODEC(ZSTD(1)),
    postprocess_seconds Float64 CODEC(ZSTD(1)),
    telemetry_seconds Float64 CODEC(ZSTD(1)),
    kv_blocks_total UInt32 CODEC(T64, ZSTD(1)),
    kv_blocks_used UInt32 CODEC(T64, ZSTD(1)),
    kv_blocks_free UInt32 CODEC(T64, ZSTD(1)),
    kv_blocks_cached UInt32 CODEC(T64, ZSTD(1)),
    prefix_hit_tokens UInt32 CODEC(T64, ZSTD(1)),
    prefix_query_tokens UInt32 CODEC(T64, ZSTD(1)),
    evictions UInt32 CODEC(T64, ZSTD(1)),
    num_waiting UInt32 CODEC(T64, ZSTD(1)),
    num_running UInt32 CODEC(T64, ZSTD(1)),
    num_preempted UInt32 CODEC(T64, ZSTD(1)),
    spec_proposed UInt32 CODEC(T64, ZSTD(1)),
    spec_accepted UInt32 CODEC(T64, ZSTD(1)),
    spec_accepted_per_pos Array(UInt32) CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(start_time)
ORDER BY (replica_id, start_time)
TTL toDateTime(start_time) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS eval_runs
(
    run_id String CODEC(ZSTD(1)),
    suite LowCardinality(String),
    start_time DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    finish_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    config_json String CODEC(ZSTD(3)),
    config_hash LowCardinality(String),
    model_name LowCardinality(String),
    weights_hash LowCardinality(String),
    quantization LowCardinality(String),
    speculative_mode LowCardinality(String),
    git_sha LowCardinality(String),
    num_items UInt32 CODEC(T64, ZSTD(1)),
    accuracy Float64 CODEC(ZSTD(1)),
    endpoint String CODEC(ZSTD(1)),
    notes String CODEC(ZSTD(3)),
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(start_time)
ORDER BY (suite, model_name, start_time)
TTL toDateTime(start_time) + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- eval items carry no instant of their own: a hidden ingest time (MATERIALIZED, so not part of
-- SELECT * nor of inserts) gives them a day partition and a TTL.
CREATE TABLE IF NOT EXISTS eval_items
(
    run_id String CODEC(ZSTD(1)),
    item_id String CODEC(ZSTD(1)),
    suite LowCardinality(String),
    task LowCardinality(String),
    scorer LowCardinality(String),
    score Float64 CODEC(ZSTD(1)),
    reference String CODEC(ZSTD(3)),
    output_text String CODEC(ZSTD(3)),
    input_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    output_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    output_logprobs Array(Float32) CODEC(ZSTD(1)),
    latency_seconds Float64 CODEC(ZSTD(1)),
    inserted_at DateTime64(6, 'UTC') MATERIALIZED now64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    INDEX idx_run_id run_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_item_id item_id TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(inserted_at)
ORDER BY (suite, task, run_id, item_id)
TTL toDateTime(inserted_at) + INTERVAL 365 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- Findings are updated in place: a re-run of a diagnostic writes the same finding_id with a later
-- last_seen, and the merge keeps that version. Replacing only happens inside a partition, so the
-- partition key is first_seen, which diagnostics keep stable for a finding; readers still take
-- argMax(..., last_seen) per finding_id (or FINAL) rather than rely on merges having run.
CREATE TABLE IF NOT EXISTS findings
(
    finding_id String CODEC(ZSTD(1)),
    kind LowCardinality(String),
    severity LowCardinality(String),
    subject String CODEC(ZSTD(1)),
    summary String CODEC(ZSTD(3)),
    window_start DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    window_end DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    evidence_json String CODEC(ZSTD(3)),
    first_seen DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    last_seen DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    diagnostic LowCardinality(String),
    INDEX idx_subject subject TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(last_seen)
PARTITION BY toDate(first_seen)
ORDER BY (kind, finding_id)
TTL toDateTime(last_seen) + INTERVAL 180 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS profiles
(
    profile_id String CODEC(ZSTD(1)),
    replica_id LowCardinality(String),
    pid UInt32 CODEC(T64, ZSTD(1)),
    start_time DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    duration_seconds Float64 CODEC(ZSTD(1)),
    stack String CODEC(ZSTD(3)),
    samples UInt32 CODEC(T64, ZSTD(1)),
    `group` LowCardinality(String),
    INDEX idx_profile_id profile_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(start_time)
ORDER BY (replica_id, `group`, start_time)
TTL toDateTime(start_time) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
