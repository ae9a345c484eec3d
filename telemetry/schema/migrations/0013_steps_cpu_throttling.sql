-- The replica's cgroup CPU throttling counters as of each step (cumulative, read at most once a second:
-- engine/core/cgroup_limits.py). A CPU quota slows a replica only while it is throttled: the share of its
-- periods throttled over a window (the difference of two rows) is the evidence a lag finding cites
-- (diagnostics/mechanisms.py). 0 where the OS exposes no counters.
ALTER TABLE steps ADD COLUMN IF NOT EXISTS cpu_periods UInt64 DEFAULT 0 CODEC(T64, ZSTD(1)) AFTER num_context_tokens;
ALTER TABLE steps ADD COLUMN IF NOT EXISTS cpu_throttled_periods UInt64 DEFAULT 0 CODEC(T64, ZSTD(1)) AFTER cpu_periods;
ALTER TABLE steps ADD COLUMN IF NOT EXISTS cpu_throttled_seconds Float64 DEFAULT 0 CODEC(ZSTD(1)) AFTER cpu_throttled_periods;
