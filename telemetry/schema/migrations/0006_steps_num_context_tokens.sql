-- The tokens the step's attention reads: the sum over the batch's sequences of their context
-- length (cached + computed + new) at this step. With the prefill and decode token counts it is
-- the batch's shape a step-time model needs: a decode step over long contexts is slower than one
-- over short ones on the same hardware, and should not read as a slow replica.
ALTER TABLE steps ADD COLUMN IF NOT EXISTS num_context_tokens UInt64 DEFAULT 0 CODEC(T64, ZSTD(1)) AFTER spec_num_drafts;
