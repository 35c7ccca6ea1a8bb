-- Outbox schema v8 (postgres): circuit breaker pauses (paused_by 'breaker') and their probe.
-- Only adds: a release that does not know these columns keeps working beside them.

-- When one worker may take the probe of a breaker's pause (ms; NULL for other pauses), and
-- the lease token of the worker that took it. Taking it moves probe_at past the probe's
-- time limit, so that a worker that dies while probing hands the probe on.
ALTER TABLE event_paused_destinations ADD COLUMN probe_at BIGINT;
ALTER TABLE event_paused_destinations ADD COLUMN probe_token TEXT;
