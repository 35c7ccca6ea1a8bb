-- Outbox schema v4 (sqlite): what each transport inbox consumes, as the broker identifies it.
--
-- One row per inbox (its consumer name, as in dead letters: nats-inbox:<durable>), written
-- on its first start and by an operator's adopt (audited in event_audit_log). stream is the
-- broker's stream name, stream_created and consumer_created the broker's creation times
-- (RFC 3339, as the broker reports them): a stream or durable consumer that was deleted and
-- created again (a wiped broker) has another, and the inbox refuses to consume from it until
-- an operator adopts it. consumer_created is NULL when the inbox may create its consumer
-- (adopted while none existed).
CREATE TABLE event_inbox_identity (
    inbox            TEXT    NOT NULL PRIMARY KEY,
    stream           TEXT    NOT NULL,
    stream_created   TEXT    NOT NULL,
    consumer_created TEXT,
    recorded_at      BIGINT  NOT NULL
);
