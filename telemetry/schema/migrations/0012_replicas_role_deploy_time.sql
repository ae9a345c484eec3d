-- Who a replica is in a deploy, and when it was deployed: the baseline rule reads both
-- (diagnostics/baseline.py). role: 'baseline' | 'candidate' | '' (not given: start order may decide,
-- when the starts are clearly apart). deploy_time: the instant the operator deployed it (`fleet up`
-- stamps one instant on every replica it starts together; `serve` alone, the process's own launch),
-- before its model loaded; 0 where unknown (rows written before this migration, engines that do not say).
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS role LowCardinality(String) DEFAULT '' AFTER labels_json;
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS deploy_time DateTime64(6, 'UTC') DEFAULT 0 CODEC(Delta, ZSTD(1)) AFTER role;
