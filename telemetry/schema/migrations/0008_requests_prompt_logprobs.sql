-- The log-probability of each prompt token given the ones before it (natural log, the model's raw
-- distribution; the first token has none), for requests that asked for prompt logprobs
-- (`prompt_logprobs` in the API: teacher-forced scoring). [] for every other request. Cross-scoring
-- sends a request one replica served to another as prompt + output with prompt_logprobs: the
-- scorer's logprobs of the same tokens, beside the server's output_logprobs, show whether the two
-- replicas run the same model, with no two clients sending the same prompt.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_logprobs Array(Float32) DEFAULT [] CODEC(ZSTD(1)) AFTER output_logprobs;
