//! Transports that carry events out of the service and into it: each provides a relay (a
//! destination of the delivery engine) and an inbox (which commits received events into this
//! service's outbox). They must not deliver on their own: the engine orders, retries, pauses
//! and dead-letters, the outbox de-duplicates.

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
mod partition;

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub use partition::{assign, partition_of, MAX_PARTITIONS};

#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
