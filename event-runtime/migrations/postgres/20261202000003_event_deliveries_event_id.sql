-- no-transaction
-- Retention: deleting an event checks that no delivery refers to it (event_id is not the leading column of the primary key). Built without locking writes to a busy table (CREATE INDEX CONCURRENTLY
-- cannot run inside a transaction: one statement, no transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_deliveries_event_id ON event_deliveries (event_id);
