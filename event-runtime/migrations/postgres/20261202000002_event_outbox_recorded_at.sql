-- no-transaction
-- Retention: the retention purge finds old events by when they were recorded. Built without locking writes to a busy table (CREATE INDEX CONCURRENTLY
-- cannot run inside a transaction: one statement, no transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_recorded_at ON event_outbox (recorded_at);
