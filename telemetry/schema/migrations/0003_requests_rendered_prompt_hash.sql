-- A chat request's prompt as its chat template rendered it, hashed (sha256 of the text; '' for
-- completions and token-ID prompts). prompt_text_hash holds the hash of what the request came as
-- (a completion's text, a chat's canonical messages JSON): the same messages with a different
-- rendered hash on two replicas means their chat templates differ.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS rendered_prompt_hash String DEFAULT '' CODEC(ZSTD(1)) AFTER output_text;
