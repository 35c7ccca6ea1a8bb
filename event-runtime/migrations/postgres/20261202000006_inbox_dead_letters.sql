-- Outbox schema v3 (postgres): dead letters of messages a transport's inbox could not accept.
--
-- kind: 'delivery' (a delivery that failed for good, as before) or 'inbox' (a received
-- message that is not CloudEvents, has an unknown type or version, or whose payload does not
-- decode: it never had a delivery row). For an inbox dead letter, handler is the inbox's
-- consumer name, name and version are the message's CloudEvents type and schemaversion or ''
-- and 0 when it has none, event_id is its CloudEvents id (or one derived from its stream and
-- stream sequence when it has none), envelope is the message body, attempts its delivery
-- count, and broker the broker's metadata as JSON ({"stream", "stream_sequence",
-- "delivery_count", "subject"}). Replaying one commits it into the outbox as if just received.
ALTER TABLE event_dead_letters ADD COLUMN kind TEXT NOT NULL DEFAULT 'delivery';
ALTER TABLE event_dead_letters ADD COLUMN broker TEXT;
-- A redelivered poison message is dead-lettered once.
CREATE INDEX event_dead_letters_inbox ON event_dead_letters (handler, event_id) WHERE kind = 'inbox';
