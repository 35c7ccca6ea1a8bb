-- Replay and purge in pages: the operation's audit row records what it selected and when it
-- finished; each dead letter it resolved names it. (Adding a nullable column without a default
-- rewrites nothing and takes its lock only for an instant.)
ALTER TABLE event_audit_log ADD COLUMN selection TEXT;
ALTER TABLE event_audit_log ADD COLUMN finished_at BIGINT;
-- Every operation recorded so far ran in one transaction: finished when it was recorded.
UPDATE event_audit_log SET finished_at = at;
ALTER TABLE event_dead_letters ADD COLUMN audit_id BIGINT;
