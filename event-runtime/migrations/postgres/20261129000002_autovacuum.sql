-- Keep planner statistics of the deliveries table fresh as it grows and shrinks quickly: the
-- claim query only stops early (index scan in next_attempt_at order) when PostgreSQL knows how
-- many rows are due.
ALTER TABLE event_deliveries SET (
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 500,
    autovacuum_vacuum_scale_factor = 0.05
);
