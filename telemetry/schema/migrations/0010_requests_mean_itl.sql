-- Each request's mean inter-token latency, computed by ClickHouse at insert (MATERIALIZED: writers
-- never send it, SELECT * does not return it, the record contract is unchanged). The expression is
-- telemetry.contract.derived.mean_itl_sql("token_times") verbatim (tests/telemetry/test_mean_itl_column.py
-- holds the two equal): nan with fewer than two tokens, Float64 as the query-time form returns it.
-- The lagging-replica diagnostic (diagnostics/request_strata.py) asks it of every request in its
-- window; computed at query time it cost reading and unpacking token_times (~0.6 s of the 1.3 s
-- query over 1M requests, diagnostics/benchmarks/diagnose_1m.py).
-- Parts written before this migration compute it when read (the same values, the old cost) and
-- store it when merged.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS mean_itl_seconds Float64 MATERIALIZED if(length(token_times) > 1, arrayAvg(arrayMap(g -> greatest(g, 0.), arrayPopFront(arrayDifference(token_times)))), nan) CODEC(ZSTD(1)) AFTER prompt_tail_max;
