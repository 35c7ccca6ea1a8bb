-- no-transaction
-- The index claims scan (ready heads, oldest due first), built without locking writes to a busy
-- table (CREATE INDEX CONCURRENTLY cannot run inside a transaction: one statement, no transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_deliveries_ready ON event_deliveries (next_attempt_at) WHERE status = 'pending' AND ready;
