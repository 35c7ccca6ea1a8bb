-- Retention: the purge finds old events by recorded_at, and deleting an event checks that no
-- delivery and no dead letter refers to it (by event_id, not the leading key column of either).
CREATE INDEX IF NOT EXISTS event_outbox_recorded_at ON event_outbox (recorded_at);
CREATE INDEX IF NOT EXISTS event_deliveries_event_id ON event_deliveries (event_id);
CREATE INDEX IF NOT EXISTS event_dead_letters_event_id ON event_dead_letters (event_id);

-- Replay and purge in pages: the operation's audit row records what it selected and when it
-- finished; each dead letter it resolved names it.
ALTER TABLE event_audit_log ADD COLUMN selection TEXT;
ALTER TABLE event_audit_log ADD COLUMN finished_at INTEGER;
-- Every operation recorded so far ran in one transaction: finished when it was recorded.
UPDATE event_audit_log SET finished_at = at;
ALTER TABLE event_dead_letters ADD COLUMN audit_id INTEGER;
