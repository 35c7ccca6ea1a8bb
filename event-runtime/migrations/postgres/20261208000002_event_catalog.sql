-- Outbox schema v9 (postgres): the event types the services on this database know, recorded by
-- each outbox when its workers start (Outbox::record_catalog), so that the standalone
-- `events` tool, which knows no types, masks the fields marked #[event(sensitive)].
-- Only adds: a release that does not know this table keeps working beside it.

CREATE TABLE IF NOT EXISTS event_catalog (
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL,
    -- The Rust type of the last service that recorded it.
    rust_type   TEXT NOT NULL,
    -- The JSON names of its sensitive payload fields: a JSON array of strings.
    sensitive   TEXT NOT NULL,
    -- The payload's JSON Schema with "x-sensitive": true on those fields; NULL without one.
    schema      TEXT,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);
