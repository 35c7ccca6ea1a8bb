//! Transports that carry events out of the service and into it: each provides a relay (a
//! destination of the delivery engine) and an inbox. None is built in yet; the NATS JetStream
//! transport lands here behind the `nats` feature.
