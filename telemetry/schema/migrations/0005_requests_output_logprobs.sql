-- The log-probability of each output token the engine sampled (natural log, under the model's
-- raw distribution: log-softmax of the logits before temperature, top-k and top-p, as vLLM's
-- default logprobs are), one per output_token_ids entry; [] where the engine did not compute them. Quality drift under sampled, load-balanced
-- traffic compares its per-request mean across replicas: a damaged model is less sure of the
-- tokens it picks even when no two requests are the same.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS output_logprobs Array(Float32) DEFAULT [] CODEC(ZSTD(1)) AFTER rendered_prompt_hash;
