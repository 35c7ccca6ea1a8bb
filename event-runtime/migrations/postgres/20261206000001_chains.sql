-- Outbox schema v6 (postgres): chains, the order of each aggregate's events across a broker.
-- Only adds: a release that does not know these tables keeps working beside them.

-- Producer side: per (relay, aggregate), the last event this relay published and the
-- predecessor it named (CloudEvents extension attribute `prevsequence`). Read when a
-- delivery is published, written when its publish completes; retention deletes a row whose
-- aggregate published nothing for longer than the retention window (the chain restarts at 0).
CREATE TABLE event_relay_chain (
    destination     TEXT    NOT NULL,
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    last_sequence   BIGINT  NOT NULL,
    last_previous   BIGINT  NOT NULL,
    published_at    BIGINT  NOT NULL,
    PRIMARY KEY (destination, aggregate_type, aggregate_id)
);
CREATE INDEX event_relay_chain_published_at ON event_relay_chain (published_at);

-- Consumer side: one row per place of a received aggregate's chain (aggregate_type is the
-- received key, `<type>@<source>`). previous: the predecessor the producer named (0: none).
-- state: 'released' (its deliveries may run), 'held' (its predecessor has not been
-- released), 'dead' (a dead letter this consumer should have taken: holds its successors),
-- 'skipped' (an accepted gap: counts as released; the event arriving later is late).
CREATE TABLE event_inbox_chain (
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    sequence        BIGINT  NOT NULL,
    previous        BIGINT  NOT NULL,
    state           TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    recorded_at     BIGINT  NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id, sequence)
);
CREATE INDEX event_inbox_chain_held ON event_inbox_chain (recorded_at) WHERE state = 'held';
CREATE INDEX event_inbox_chain_recorded_at ON event_inbox_chain (recorded_at);

-- One row per received aggregate: locked by every commit that links events of it (two
-- instances committing adjacent events wait for each other instead of both holding), and
-- its last activity (retention).
CREATE TABLE event_inbox_chain_aggregates (
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    last_at         BIGINT  NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- A held event whose predecessor did not arrive within gap_after. closed_at / resolution
-- ('arrived', 'accepted') once it closed; audit_id names the operator's accept.
CREATE TABLE event_inbox_gaps (
    id                 BIGSERIAL PRIMARY KEY,
    aggregate_type     TEXT    NOT NULL,
    aggregate_id       TEXT    NOT NULL,
    missing_sequence   BIGINT  NOT NULL,
    waiting_sequence   BIGINT  NOT NULL,
    waiting_event_id   TEXT    NOT NULL,
    waiting_since      BIGINT  NOT NULL,
    dead_letter_id     BIGINT,
    opened_at          BIGINT  NOT NULL,
    closed_at          BIGINT,
    resolution         TEXT,
    audit_id           BIGINT
);
CREATE UNIQUE INDEX event_inbox_gaps_open ON event_inbox_gaps (aggregate_type, aggregate_id, missing_sequence) WHERE closed_at IS NULL;

-- A delivery of a held event is part of its run (it blocks the deliveries after it) but is
-- never made ready. Released deliveries leave the partial index, so that finding where a run
-- stops costs nothing when nothing is held.
ALTER TABLE event_deliveries ADD COLUMN held BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX event_deliveries_held ON event_deliveries (handler, aggregate_type, aggregate_id, sequence) WHERE held;
