-- Outbox schema v5 (postgres): where a received message came from, in transport-neutral terms.
--
-- origin is JSON: {"transport", "source", "position", "delivery_count", "attributes"} (a NATS
-- inbox: transport "nats", source the stream, position the stream sequence, attribute
-- "subject"). event_outbox.origin is set for every event a transport's inbox commits and NULL
-- for the service's own events (and for events received before this version). The inbox dead
-- letters' broker column becomes origin; rows written before keep the NATS broker metadata
-- they had ({"stream", "stream_sequence", "delivery_count", "subject"}), which the runtime
-- reads as an origin of transport "nats".
ALTER TABLE event_outbox ADD COLUMN origin TEXT;
ALTER TABLE event_dead_letters RENAME COLUMN broker TO origin;
