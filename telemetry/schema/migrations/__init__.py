"""The versioned migration files (NNNN_name.sql), applied in order by `telemetry.schema.migrate`.

Never edit a file once it has been applied anywhere: add the next one (the migrator checks
checksums and refuses a changed file). Statements end with ';' at the end of a line; the forms
`render` understands are CREATE TABLE IF NOT EXISTS <name> (...) ENGINE = ... and ALTER TABLE.
"""
