-- The log-probability of each output token the engine sampled (natural log, under the
-- distribution it sampled from, after temperature / top-k / top-p), one per output_token_ids
-- entry; [] where the engine did not compute them. Quality drift under sampled, load-balanced
-- traffic compares its per-request mean across replicas: a damaged model is less sure of the
-- tokens it picks even when no two requests are the same.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS output_logprobs Array(Float32) DEFAULT [] CODEC(ZSTD(1)) AFTER rendered_prompt_hash;
