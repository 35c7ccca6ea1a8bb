//! NATS JetStream (feature `nats`): the relay ([`NatsRelay`]) publishes committed events from
//! the outbox to a stream, the inbox ([`NatsInbox`]) commits received events into a consuming
//! service's own outbox, and [`StreamSpec`] creates or verifies the stream. Works with
//! nats-server 2.9 and later: `async-nats` is built without its features for newer servers.
//!
//! # The path of an event between two services
//! 1. The producer commits an event that the relay routes ([`RelayConfig`]): its outbox row and
//!    a delivery to the relay are written in the same transaction.
//! 2. The engine delivers it: the relay publishes the envelope as a CloudEvents
//!    structured-mode message (CloudEvents NATS protocol binding 1.0: body = the envelope
//!    JSON, `Content-Type: application/cloudevents+json`) on `events.<event name>` with
//!    `Nats-Msg-Id` = the event id, and completes the delivery on the publish ack. At most one
//!    publish per aggregate is unacknowledged; different aggregates are pipelined up to
//!    [`RelayConfig::in_flight`].
//! 3. The consumer's inbox fetches a batch from a durable pull consumer, decodes each message
//!    through its registry, commits the batch once into its own outbox (event rows and
//!    delivery rows for its handlers; an event id already there is skipped), and only then
//!    acknowledges each message and waits for the server to confirm (double ack). Its engine
//!    runs its handlers with the usual guarantees.
//! 4. A message the inbox cannot accept is stored in the consuming service's dead letter queue
//!    (handler `nats-inbox:<durable>`, with its stream, stream sequence, delivery count and
//!    subject) and terminated, and the rest of its batch flows: one that does not decode
//!    (`undecodable`), of a name or version this code does not know (`unknown_event`), and one
//!    whose (aggregate, sequence) the consuming outbox already holds under another event id,
//!    or that an earlier message of the batch claims (`conflict`: a producer that re-published
//!    its events with new ids, from a fresh database), and one its commit refuses for good:
//!    U+0000 in its aggregate, an envelope over this outbox's `max_envelope_bytes` or a
//!    sequence above `i64::MAX` (`undecodable`), an in-transaction handler of this service
//!    that fails permanently or panics on it (`permanent`). A commit that fails otherwise (the
//!    database is down, a handler's transient error) dead-letters nothing: the batch is
//!    redelivered.
//!
//! Delivery is at-least-once on the wire and the outbox makes effects once: the stream drops
//! a re-publish within its duplicate window, and the inbox drops a redelivery, or a
//! re-publish after the window, for as long as the consuming outbox keeps the event row
//! ([`OutboxConfig::retention`](crate::OutboxConfig::retention): that is the inbox's
//! de-duplication window, checked at start-up to exceed the consumer's redelivery horizon).
//!
//! # Metrics
//! Through the `metrics` crate, next to the engine's (crate docs):
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `events_nats_published_total` | counter | publishes the server acknowledged (a duplicate ack included) |
//! | `events_nats_published_duplicates_total` | counter | of those, acks saying the stream already held the message id |
//! | `events_nats_publish_failures_total` | counter, label `reason` | `unavailable` (not connected: the relay pauses), `timeout`, `no_stream`, `too_large`, `other` |
//! | `events_nats_in_flight` | gauge | publishes sent and not yet acknowledged, in this process |
//! | `events_destination_oldest_pending_age_seconds{handler="nats:<stream>"}` | gauge | the lag: age in seconds of the oldest committed event the broker has not acknowledged yet (0 when none), set by the outbox's workers every [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval) (5 s) |
//! | `events_nats_received_total` | counter | messages an inbox fetched |
//! | `events_nats_duplicates_total` | counter | of those, event ids the consuming outbox already held (skipped) |
//! | `events_nats_acked_total` | counter | messages acknowledged after their commit (ack confirmed) |
//! | `events_nats_naked_total` | counter | messages given back (the commit failed): redelivered after 1 s |
//! | `events_nats_terminated_total` | counter | messages terminated after being stored as dead letters |
//! | `events_nats_dead_lettered_total` | counter | messages stored in the dead letter queue (cannot be accepted) |
//!
//! The lag is the engine's per-destination gauge rather than one of the relay's own: it is
//! read from the store (the pending deliveries), so it counts what this process has not
//! claimed yet and what another process or a crashed one left, keeps growing while the
//! broker is unreachable and the relay is paused (when the relay publishes nothing it could
//! time), and is the same gauge for every other destination.
//!
//! # Limitations
//! One inbox instance per durable consumer at a time: several instances sharing the work with
//! per-aggregate order (partitioned subjects) come later.

mod inbox;
mod relay;
mod stream;

use std::time::Duration;

pub use inbox::{InboxConfig, InboxReport, NatsInbox, ReceivedBatch};
pub use relay::{NatsRelay, RelayConfig};
pub use stream::{StreamShape, StreamSpec};

use crate::{OutboxError, StoreError};

/// The `Content-Type` of a CloudEvents structured-mode message with a JSON event format.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Why a NATS operation or a start-up check failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// Talking to the server failed. async-nats prints a cause inside its own message and
    /// returns it again as the source: printed here once, with no source.
    #[error("NATS: {0} failed: {1}")]
    Broker(&'static str, async_nats::Error),
    /// No stream of that name.
    #[error("there is no JetStream stream `{0}` (create it with StreamSpec::create or `events nats stream create`)")]
    NoStream(String),
    /// The stream exists with another shape.
    #[error("stream `{stream}`: {field} is {found}, expected {expected}")]
    StreamMismatch {
        /// The stream.
        stream: String,
        /// The field that differs.
        field: &'static str,
        /// What was expected.
        expected: String,
        /// What the server has.
        found: String,
    },
    /// The relay publishes to a subject that the stream does not capture.
    #[error("subject `{subject}` is not captured by stream `{stream}`")]
    SubjectNotCaptured {
        /// The subject.
        subject: String,
        /// The stream.
        stream: String,
    },
    /// The stream would take a re-publish after its duplicate window as a second message.
    #[error("stream `{stream}` has a duplicate window of {window:?}, shorter than the relay's retry horizon of {horizon:?}: a re-publish after the window would be stored twice")]
    DuplicateWindowTooShort {
        /// The stream.
        stream: String,
        /// Its duplicate window.
        window: Duration,
        /// The relay's retry horizon.
        horizon: Duration,
    },
    /// The outbox accepts envelopes the broker would refuse.
    #[error("the outbox accepts envelopes of {envelope} bytes, which with {headers} bytes of headers exceed {what} of {limit} bytes: lower OutboxConfig::max_envelope_bytes")]
    EnvelopeTooLarge {
        /// `OutboxConfig::max_envelope_bytes`.
        envelope: usize,
        /// The relay's headers.
        headers: usize,
        /// The broker's limit.
        limit: usize,
        /// Which limit.
        what: &'static str,
    },
    /// The consumer would redeliver a message after the consuming outbox forgot its event id.
    #[error("the outbox's retention ({retention:?}) must exceed the consumer's redelivery horizon ({horizon:?}), or a late redelivery would not be recognised as a duplicate")]
    RetentionTooShort {
        /// The outbox's retention.
        retention: Duration,
        /// The consumer's redelivery horizon.
        horizon: Duration,
    },
    /// The relay was checked against an outbox that does not deliver to it.
    #[error("the outbox has no destination `{0}`: add the relay with OutboxBuilder::destination before building")]
    NotADestination(String),
    /// An inbox dead letter still does not decode: nothing was replayed.
    #[error("dead letter {0} still does not decode")]
    Replay(i64, #[source] event_core::DecodeError),
    /// A configuration value is invalid.
    #[error("invalid inbox configuration: {0}")]
    Config(String),
    /// The consuming outbox refused the batch.
    #[error("committing received events failed")]
    Outbox(#[from] OutboxError),
    /// The consuming store failed.
    #[error("the store failed")]
    Store(#[from] StoreError),
}

impl NatsError {
    fn broker<E: Into<async_nats::Error>>(what: &'static str) -> impl Fn(E) -> NatsError {
        move |e| NatsError::Broker(what, e.into())
    }
}

/// The bytes of the header block the relay sends (`NATS/1.0`, `Nats-Msg-Id` with a
/// hyphenated UUID, `Content-Type`), as the protocol writes it.
fn header_bytes() -> usize {
    let line = |name: &str, value_len: usize| name.len() + 2 + value_len + 2;
    "NATS/1.0\r\n".len() + line("Nats-Msg-Id", 36) + line("Content-Type", CONTENT_TYPE.len()) + 2
}

/// `s` as one subject token: characters a token cannot hold become `_`.
fn subject_token(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '.' | '*' | '>' => '_',
            c if c.is_whitespace() || c.is_control() => '_',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_block_size() {
        let block = format!(
            "NATS/1.0\r\nNats-Msg-Id: {}\r\nContent-Type: {}\r\n\r\n",
            uuid::Uuid::now_v7(),
            super::CONTENT_TYPE
        );
        assert_eq!(super::header_bytes(), block.len());
    }
}
