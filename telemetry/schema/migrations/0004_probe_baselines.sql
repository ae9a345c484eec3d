-- Golden probe baselines: a probe round pinned as what a model should answer (`infersight probe
-- --pin`). The token IDs in and out are copied here because the requests they came from expire
-- with the requests table's TTL; a pin lasts until it is replaced (ReplacingMergeTree on
-- pinned_time: the latest pin of a probe wins).
CREATE TABLE IF NOT EXISTS probe_baselines
(
    model_name LowCardinality(String),
    probe_id String CODEC(ZSTD(1)),
    pinned_time DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    round_id String CODEC(ZSTD(1)),
    replica_id LowCardinality(String),
    api LowCardinality(String),
    weights_hash String CODEC(ZSTD(1)),
    tokenizer_hash String CODEC(ZSTD(1)),
    chat_template_hash String CODEC(ZSTD(1)),
    config_hash String CODEC(ZSTD(1)),
    engine_version LowCardinality(String),
    prompt_text_hash String CODEC(ZSTD(1)),
    rendered_prompt_hash String CODEC(ZSTD(1)),
    sampling_params_json String CODEC(ZSTD(3)),
    prompt_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    output_token_ids Array(UInt32) CODEC(T64, ZSTD(1)),
    finish_reason LowCardinality(String),
    note String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree(pinned_time)
ORDER BY (model_name, probe_id)
SETTINGS non_replicated_deduplication_window = 10000;
