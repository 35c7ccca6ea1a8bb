-- Outbox schema v2 (sqlite): runs per (destination, aggregate), worker leases, paused destinations.
-- Times are milliseconds since the Unix epoch, UTC.

-- Of the pending deliveries of one (handler, aggregate) with a sequence above 0, only the head
-- (the lowest) is ready; claims scan ready heads only and extend each into its run, so that a
-- long backlog of one aggregate costs a claim nothing.
ALTER TABLE event_deliveries ADD COLUMN ready BOOLEAN NOT NULL DEFAULT TRUE;
UPDATE event_deliveries SET ready = FALSE
WHERE status = 'pending' AND sequence > 0 AND EXISTS (
    SELECT 1 FROM event_deliveries p
    WHERE p.handler = event_deliveries.handler
      AND p.aggregate_type = event_deliveries.aggregate_type
      AND p.aggregate_id = event_deliveries.aggregate_id
      AND p.sequence < event_deliveries.sequence
      AND p.status IN ('pending', 'dead'));

-- A lease belongs to a worker (event_leases), renewed while the worker lives, instead of an
-- expiry per delivery that nothing renewed. Dropping the old column also makes a worker of
-- release 0.1.0 that still runs against this database fail every claim ("lease_until" does
-- not exist) instead of taking over deliveries that live workers hold.
ALTER TABLE event_deliveries DROP COLUMN lease_until;
DROP INDEX event_deliveries_due;
-- Deliveries are found by their primary key and fenced by their token; an index on the token
-- grew with every claim of a long-lived worker and only tempted planners away from the key.
DROP INDEX event_deliveries_lease;
CREATE INDEX event_deliveries_ready ON event_deliveries (next_attempt_at) WHERE status = 'pending' AND ready;

CREATE TABLE event_leases (
    token        TEXT    PRIMARY KEY NOT NULL,
    owner        TEXT    NOT NULL,
    acquired_at  BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL
);

-- A paused destination is claimed by no worker. paused_by: 'operator', or the runtime
-- component that paused it (its pauses expire unless renewed).
CREATE TABLE event_paused_destinations (
    destination  TEXT    NOT NULL,
    paused_by    TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    paused_at    BIGINT  NOT NULL,
    expires_at   BIGINT,
    PRIMARY KEY (destination, paused_by)
);
