//! Test support: an outbox over a temporary SQLite file with a clock the test moves
//! ([`TestOutbox`], [`ManualClock`], feature `testing`), the store [`conformance`] suite a
//! backend proves itself with (feature `testing`), and the crash-safety suite's fault points
//! (feature `fault-injection`). Never enable either in production builds.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
//! use event_runtime::testing::TestOutbox;
//! use event_runtime::{Dispatcher, Tx};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.placed")]
//! struct OrderPlaced {
//!     #[event(aggregate_id)]
//!     order_id: String,
//! }
//!
//! #[event_handler(name = "flaky")]
//! fn flaky(_: &OrderPlaced, _tx: &mut Tx) -> Result<(), HandlerError> {
//!     Err(HandlerError::transient_msg("the API is down"))
//! }
//!
//! let outbox = TestOutbox::new(Dispatcher::builder_empty().handler::<flaky>()).await?;
//! outbox
//!     .commit([Envelope::new(OrderPlaced { order_id: "o-1".into() }).with_sequence(1)])
//!     .await?;
//! // Retries are due at once: the harness moves its clock past each backoff.
//! outbox.drain().await?;
//! let dead = outbox.dead_letters().await?;
//! assert_eq!(dead.len(), 1);
//! assert_eq!(dead[0].attempts, 5); // the default RetryPolicy: 5 attempts
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "testing")]
mod clock;
#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "fault-injection")]
mod fault;
#[cfg(feature = "testing")]
mod harness;

#[cfg(feature = "testing")]
pub use clock::ManualClock;
#[cfg(feature = "fault-injection")]
pub use fault::{FaultAction, FaultPoint};
#[cfg(feature = "testing")]
pub use harness::TestOutbox;
