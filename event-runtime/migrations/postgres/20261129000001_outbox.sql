-- Outbox schema v1 (PostgreSQL). Times are milliseconds since the Unix epoch, UTC.

-- One row per accepted event; `envelope` is the CloudEvents JSON, byte for byte.
CREATE TABLE event_outbox (
    event_id        TEXT    PRIMARY KEY NOT NULL,
    name            TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    sequence        BIGINT  NOT NULL,
    occurred_at     BIGINT  NOT NULL,
    recorded_at     BIGINT  NOT NULL,
    envelope        TEXT    NOT NULL
);
-- Two commits that record the same sequence for one aggregate conflict (optimistic concurrency).
CREATE UNIQUE INDEX event_outbox_aggregate_sequence
    ON event_outbox (aggregate_type, aggregate_id, sequence) WHERE sequence > 0;

-- One row per (event, after-commit handler). status: pending | completed | dead | purged.
CREATE TABLE event_deliveries (
    handler          TEXT    NOT NULL,
    event_id         TEXT    NOT NULL REFERENCES event_outbox (event_id),
    aggregate_type   TEXT    NOT NULL,
    aggregate_id     TEXT    NOT NULL,
    sequence         BIGINT  NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending',
    attempts         BIGINT  NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT  NOT NULL,
    lease_token      TEXT,
    lease_until      BIGINT,
    created_at       BIGINT  NOT NULL,
    first_failed_at  BIGINT,
    last_failed_at   BIGINT,
    last_error       TEXT,
    completed_at     BIGINT,
    PRIMARY KEY (handler, event_id)
);
CREATE INDEX event_deliveries_due ON event_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX event_deliveries_aggregate
    ON event_deliveries (handler, aggregate_type, aggregate_id, sequence)
    WHERE status IN ('pending', 'dead');
CREATE INDEX event_deliveries_lease ON event_deliveries (lease_token) WHERE lease_token IS NOT NULL;
CREATE INDEX event_deliveries_completed ON event_deliveries (completed_at) WHERE status = 'completed';

-- Deliveries that failed for good. `envelope` is the original, byte for byte.
CREATE TABLE event_dead_letters (
    id               BIGSERIAL PRIMARY KEY,
    event_id         TEXT    NOT NULL,
    handler          TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    version          BIGINT  NOT NULL,
    envelope         TEXT    NOT NULL,
    attempts         BIGINT  NOT NULL,
    first_failed_at  BIGINT  NOT NULL,
    last_failed_at   BIGINT  NOT NULL,
    reason           TEXT    NOT NULL,
    error_chain      TEXT    NOT NULL,
    dead_at          BIGINT  NOT NULL,
    resolved_at      BIGINT,
    resolution       TEXT
);
CREATE INDEX event_dead_letters_open ON event_dead_letters (dead_at) WHERE resolved_at IS NULL;

-- Who replayed or purged which dead letters, when and why.
CREATE TABLE event_audit_log (
    id               BIGSERIAL PRIMARY KEY,
    action           TEXT    NOT NULL,
    actor            TEXT    NOT NULL,
    reason           TEXT    NOT NULL,
    at               BIGINT  NOT NULL,
    dead_letter_ids  TEXT    NOT NULL,
    count            BIGINT  NOT NULL
);
