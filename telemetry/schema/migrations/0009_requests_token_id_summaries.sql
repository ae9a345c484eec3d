-- Per-request summaries of the token-ID arrays, computed by ClickHouse at insert (MATERIALIZED:
-- writers never send them, SELECT * does not return them, the record contract is unchanged).
-- The tokenizer diagnostic asks these of every request in its window; computed at query time
-- they cost a pass over prompt_token_ids (~490 MB of UInt32 per million requests): 1.1 s for
-- cityHash64, 0.3 s to decompress, 0.2 s per arrayMax (diagnostics/benchmarks/diagnose_1m.py).
-- * prompt_ids_hash: the prompt's IDs hashed (same text, different IDs across replicas);
-- * prompt_ids_head: its first two IDs (a prompt that starts with BOS twice);
-- * prompt_ids_max, output_ids_max: the largest ID (IDs past the vocabulary);
-- * prompt_tail_min, prompt_tail_max: the range of the IDs after the first, a bound that rules a
--   prompt out of holding any given special token (specials sit at the ends of a vocabulary) before
--   its array is read.
-- Parts written before this migration compute them when read (the same values, the old cost) and
-- store them when merged.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_ids_hash UInt64 MATERIALIZED cityHash64(prompt_token_ids) CODEC(ZSTD(1)) AFTER prompt_logprobs;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_ids_head Array(UInt32) MATERIALIZED arraySlice(prompt_token_ids, 1, 2) CODEC(T64, ZSTD(1)) AFTER prompt_ids_hash;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_ids_max UInt32 MATERIALIZED arrayMax(prompt_token_ids) CODEC(T64, ZSTD(1)) AFTER prompt_ids_head;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS output_ids_max UInt32 MATERIALIZED arrayMax(output_token_ids) CODEC(T64, ZSTD(1)) AFTER prompt_ids_max;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_tail_min UInt32 MATERIALIZED arrayMin(arraySlice(prompt_token_ids, 2)) CODEC(T64, ZSTD(1)) AFTER output_ids_max;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_tail_max UInt32 MATERIALIZED arrayMax(arraySlice(prompt_token_ids, 2)) CODEC(T64, ZSTD(1)) AFTER prompt_tail_min;
