-- The number of drafts per step: vLLM's mean acceptance length (1 + accepted / drafts)
-- needs it exactly; estimating it from proposed tokens is wrong when drafts vary in length.
ALTER TABLE steps ADD COLUMN IF NOT EXISTS spec_num_drafts UInt32 DEFAULT 0 CODEC(T64, ZSTD(1)) AFTER spec_accepted_per_pos;
