-- What the engine itself measured of a request whose `requests` row another process writes: a
-- recording proxy in front of vLLM writes the row (token IDs, the client's view of the times),
-- vLLM's stat-logger plugin writes this one (queue, prefill, decode as the engine scheduled them,
-- cached tokens, preemptions). request_id is the proxy's (the plugin maps vLLM's own id back:
-- engine/serving/vllm_adapter/request_ids.py), so the two join on (replica_id, request_id):
-- telemetry.contract.derived.ENGINE_TIMING_JOIN. engine_request_id keeps the engine's own id.
CREATE TABLE IF NOT EXISTS engine_request_timings
(
    replica_id LowCardinality(String),
    request_id String CODEC(ZSTD(1)),
    engine_request_id String CODEC(ZSTD(1)),
    model_name LowCardinality(String),
    arrival_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
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
    preemptions UInt32 CODEC(T64, ZSTD(1)),
    finish_reason LowCardinality(String),
    error String CODEC(ZSTD(3)),
    INDEX idx_request_id request_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(arrival_time)
ORDER BY (replica_id, request_id)
TTL toDateTime(arrival_time) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
