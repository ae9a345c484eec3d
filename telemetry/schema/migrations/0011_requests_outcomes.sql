-- Availability: every request a replica or a recording proxy received is a row, the refused ones too
-- (telemetry/contract/outcomes.py). How it ended: the HTTP status the client got (0 on the engine's own
-- rows), an error code from the fixed vocabulary, the field a rejection named, the numbers behind it
-- (prompt length and limit, the queue's state, the API's own code) as JSON, and behind a proxy the
-- upstream's status and error body (text: kept 7 days, like the prompt text, and written only where the
-- operator allows text).
ALTER TABLE requests ADD COLUMN IF NOT EXISTS http_status UInt16 DEFAULT 0 CODEC(T64, ZSTD(1));
ALTER TABLE requests ADD COLUMN IF NOT EXISTS error_code LowCardinality(String) DEFAULT '' AFTER http_status;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS error_param String DEFAULT '' CODEC(ZSTD(1)) AFTER error_code;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS error_detail_json String DEFAULT '' CODEC(ZSTD(3)) AFTER error_param;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS upstream_status UInt16 DEFAULT 0 CODEC(T64, ZSTD(1)) AFTER error_detail_json;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS upstream_error_body String DEFAULT '' CODEC(ZSTD(3)) TTL toDateTime(arrival_time) + INTERVAL 7 DAY AFTER upstream_status;
