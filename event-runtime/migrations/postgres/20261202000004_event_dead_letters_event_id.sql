-- no-transaction
-- Retention: deleting an event checks that no dead letter refers to it. Built without locking writes to a busy table (CREATE INDEX CONCURRENTLY
-- cannot run inside a transaction: one statement, no transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_dead_letters_event_id ON event_dead_letters (event_id);
