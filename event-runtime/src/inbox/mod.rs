//! The inbox core every transport shares: a batch of received messages committed into this
//! service's outbox, with a verdict per message.
//!
//! A transport's inbox is an adapter around it: it fetches messages from its broker, hands
//! them to [`Outbox::receive`](crate::Outbox::receive) as [`Incoming`] messages (the body as received, its content
//! type, and its [`Origin`]), and settles each with the broker as its [`Verdict`] says —
//! acknowledge [`Accepted`](Verdict::Accepted) and [`Duplicate`](Verdict::Duplicate),
//! terminate (never redeliver) [`DeadLettered`](Verdict::DeadLettered), give back
//! [`Retry`](Verdict::Retry) to be redelivered. The NATS JetStream inbox
//! ([`transport::nats::NatsInbox`](crate::transport)) is one.
//!
//! What the core does for every transport:
//! - decodes each body as a CloudEvents 1.0 JSON envelope (structured mode; a content type
//!   other than `application/cloudevents+json`, compared case-insensitively and without its
//!   parameters, is refused) of an event this service's registry knows, at a version it knows
//!   or can upcast. Beyond CloudEvents' required attributes the envelope needs what this
//!   framework's producers always write ([`RawEnvelope`](event_core::RawEnvelope)): an `id`
//!   that is a UUID, `time`, `subject` (the aggregate id), `schemaversion`, and `sequence`
//!   for an ordered event; a producer of another framework must add them;
//! - commits the batch in one transaction: each accepted event is stored with the JSON as
//!   received and its origin, under the aggregate key `<aggregate type>@<source>` (the
//!   producer's CloudEvents `source`, so that it never collides with this service's own
//!   aggregates), with deliveries to local handlers only (never to a relay);
//! - skips an event id the outbox holds (a redelivery, a re-publish): `Duplicate`;
//! - writes what cannot be accepted to the dead letter queue (kind `inbox`, the inbox's name
//!   as its handler, the body as received, the origin, the reason and error chain), once per
//!   (inbox, event id; a body without a readable id is named as [`Incoming::message_id`]
//!   says): a body that does not decode (`undecodable`), an unknown event name or
//!   version (`unknown_event`), an (aggregate, sequence) the outbox holds under another event
//!   id (`conflict`: a producer that re-published with new ids), or one the commit refuses
//!   for good (an in-transaction handler's permanent error: `permanent`; text the database
//!   refuses, an envelope over [`OutboxConfig::max_envelope_bytes`](crate::OutboxConfig):
//!   `undecodable`, found before the commit). None of these blocks the rest of the batch. A
//!   dead letter keeps the body as text: bytes that are not UTF-8, and U+0000 (which
//!   PostgreSQL cannot store in text), are replaced by U+FFFD; a body over
//!   `max_envelope_bytes` (which no replay could commit) keeps only that many first bytes, and
//!   its error chain says how long it was.
//!
//! Name each inbox once and keep the name (`<transport>-inbox:<consumer>` by convention, as
//! `nats-inbox:billing`): it is its dead letters' handler, which no handler of the application
//! should share.
//!
//! # Order across services
//!
//! The core never trusts the order a broker delivers in (a consumer that crashed before its
//! acks, or a second instance on one durable consumer, gets an aggregate's later events before
//! its earlier ones). A relay of this framework adds to every ordered event the sequence of
//! the previous event of its aggregate that it published (the CloudEvents extension attribute
//! `prevsequence`: see [`Delivery::wire_envelope`](crate::Delivery::wire_envelope)); the core
//! stores every accepted event at once, but *releases* it to the local handlers only when it
//! names no predecessor (`0`, or no attribute: an older producer) or its predecessor was
//! released — transitively, so nothing after a hole runs. Until then its deliveries are held
//! (part of their runs, never ready); the predecessor's arrival releases them in chain order.
//! Unordered handlers and unsequenced events are never held. A `prevsequence` that is not an
//! earlier sequence of the event's aggregate (not digits, negative, at or after the event's
//! own) names no predecessor: the event is not held, with a warning and the counter
//! `events_inbox_invalid_prevsequence_total`. Two instances committing
//! adjacent events of one aggregate at once wait for each other on the aggregate's row.
//!
//! - A dead letter of an event name this service does not register fills its place in the
//!   chain. One it should have taken (an unknown version, undecodable, a conflict, refused
//!   for good) holds the events after it: replaying it releases them; purging it accepts the
//!   gap.
//! - A predecessor that has not arrived after
//!   [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after) (default 5 min) is a [`Gap`]:
//!   reported once (a warning, `events_inbox_gaps_opened_total`), listed by `events inbox gaps`
//!   and `events dlq list` (kind `gap`), and never skipped until an operator accepts it
//!   ([`Outbox::accept_gaps`](crate::Outbox::accept_gaps), `events inbox gaps accept`). A gap
//!   closes itself when its event arrives; an event that arrives after its gap was accepted,
//!   for that place or an earlier one not received yet, is dead-lettered as `late`.
//! - Closing a gap, in order: re-fetch the missing event from the broker where it may still
//!   be (NATS: [`Refetch`](crate::transport) / `events inbox gaps refetch`, which reads the
//!   stream from the consumer's first unacknowledged message up to the waiting event and
//!   commits what it finds through this core); have the producer publish it again when the
//!   broker lost it ([`Store::republish`](crate::Store::republish) / `events relay
//!   republish` on the producer's database: the same event ids, absorbed here when they are
//!   not missing); accept it as the last resort.
//! - A consumer must receive every subject the relay publishes for the aggregate types it
//!   takes: an event filtered out of its subscription is a gap.
//! - Chain state is kept for [`OutboxConfig::retention`](crate::OutboxConfig::retention)
//!   after an aggregate's last event; an aggregate idle longer starts a new chain, so a loss
//!   older than the retention window goes undetected.
//! - In-transaction handlers of received events run at commit and cannot wait for a
//!   predecessor: they would see the broker's order. The NATS inbox refuses to start with
//!   any unless its configuration allows them (`InboxConfig::allow_in_transaction_handlers`,
//!   for handlers of the service's own events); use after-commit handlers (the default) for
//!   received events.
//!
//! A dead letter of an inbox is replayed through the core as well — no broker connection is
//! needed: [`Outbox::replay_inbox_dead_letters`](crate::Outbox::replay_inbox_dead_letters) decodes it again (after a deploy that knows
//! its type) and commits it as if just received, with its origin.
//!
//! ```
//! use event_core::{event_handler, DomainEvent, Envelope};
//! use event_runtime::inbox::{Incoming, Origin, Verdict};
//! use event_runtime::{Dispatcher, Outbox, Store};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.shipped", version = 1)]
//! struct OrderShipped {
//!     #[event(aggregate_id)]
//!     order_id: String,
//! }
//!
//! #[event_handler]
//! fn invoice(_: &OrderShipped) {}
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::connect("sqlite::memory:").await?;
//! let outbox = Outbox::builder(store)
//!     .dispatcher(Dispatcher::builder_empty().handler::<invoice>())
//!     .build()?;
//!
//! // What a transport received: the producer's envelope, and where it was read.
//! let body = serde_json::to_vec(
//!     &Envelope::new(OrderShipped { order_id: "A-1".into() })
//!         .with_sequence(1)
//!         .with_source("urn:shop:orders"),
//! )?;
//! let batch = vec![
//!     Incoming::new(body.clone(), Origin::new("my-queue", "orders", 1)),
//!     Incoming::new(body, Origin::new("my-queue", "orders", 1).delivery_count(2)),
//!     Incoming::new(b"not an envelope".to_vec(), Origin::new("my-queue", "orders", 2)),
//! ];
//! let receipt = outbox.receive("my-queue:billing", batch).await;
//! assert!(receipt.error.is_none());
//! assert!(matches!(receipt.verdicts[0], Verdict::Accepted));
//! assert!(matches!(receipt.verdicts[1], Verdict::Duplicate));
//! assert!(matches!(receipt.verdicts[2], Verdict::DeadLettered(_)));
//! // Acknowledge 0 and 1, terminate 2 with the broker; the outbox's workers run `invoice`.
//! outbox.drain(std::time::Duration::from_secs(5)).await?;
//! # Ok(())
//! # }
//! ```

mod gaps;
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub(crate) mod group;
mod origin;
mod receive;
mod replay;

pub use crate::store::backend::Gap;
pub use crate::store::GapAcceptance;

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub use group::GroupConfig;
pub use origin::Origin;

use crate::store::DeadLetterReason;
use crate::OutboxError;

/// Why an inbox must not start on `outbox`, when the outbox registers in-transaction handlers
/// (a transport's inbox refuses them unless its configuration allows them): they run when a
/// received event is committed, before a predecessor it waits for has arrived.
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub(crate) fn in_transaction_refusal(outbox: &crate::Outbox) -> Option<String> {
    let in_transaction: Vec<&str> = outbox
        .dispatcher()
        .registry()
        .handlers()
        .iter()
        .filter(|h| h.mode == event_core::DeliveryMode::InTransaction)
        .map(|h| h.name)
        .collect();
    (!in_transaction.is_empty()).then(|| {
        format!(
            "the consuming outbox registers in-transaction handlers ({}): they run when a received \
             event is committed, before a predecessor it waits for arrives, so they would see the \
             broker's order, not the producer's; make them after-commit handlers, or allow them \
             with InboxConfig::allow_in_transaction_handlers(true) when they handle only this \
             service's own events",
            in_transaction.join(", ")
        )
    })
}

/// A message a transport received, as the inbox core takes it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Incoming {
    /// The body as received: a CloudEvents 1.0 JSON envelope (structured mode).
    pub body: Vec<u8>,
    /// The message's content type, when the transport carries one (a NATS `Content-Type`
    /// header, an AMQP `content-type` property); `None` is taken as CloudEvents JSON. One
    /// that does not start with `application/cloudevents+json` is refused (`undecodable`).
    pub content_type: Option<String>,
    /// The message id the broker de-duplicates by (NATS `Nats-Msg-Id`), if any. A dead letter
    /// of a body without a readable event id is named by it when it is a UUID; otherwise by a
    /// name-based UUID (version 5) of the message's transport, source, position, attributes,
    /// this id and its body — the same on every redelivery of the message, different for two
    /// different messages, whatever the transport numbers (or does not number) them.
    pub message_id: Option<String>,
    /// Where it came from.
    pub origin: Origin,
}

impl Incoming {
    /// A message with `body`, read at `origin`.
    pub fn new(body: impl Into<Vec<u8>>, origin: Origin) -> Self {
        Incoming {
            body: body.into(),
            content_type: None,
            message_id: None,
            origin,
        }
    }

    /// Sets the content type the transport reported.
    #[must_use]
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Sets the broker's message id.
    #[must_use]
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }
}

/// What became of one received message, and so what its transport tells the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Committed into the outbox: acknowledge it.
    Accepted,
    /// Its event id was in the outbox already (a redelivery, a re-publish, or a second copy
    /// in the same batch): nothing written; acknowledge it.
    Duplicate,
    /// Written to the dead letter queue for this reason (or found there already): terminate
    /// it, the broker must not redeliver it.
    DeadLettered(DeadLetterReason),
    /// Not committed (see [`Receipt::error`]): give it back to the broker, to be redelivered
    /// (an accepted copy is then a duplicate).
    Retry,
}

impl Verdict {
    /// Whether the message is settled in the outbox (accepted, duplicate or dead-lettered):
    /// the broker may forget it.
    pub fn is_settled(&self) -> bool {
        !matches!(self, Verdict::Retry)
    }
}

/// What [`Outbox::receive`](crate::Outbox::receive) did with a batch.
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "each message must be settled with its broker as its verdict says"]
pub struct Receipt {
    /// One per message, in the batch's order.
    pub verdicts: Vec<Verdict>,
    /// The counts (`received`, `appended`, `duplicates`, `dead_lettered`; the transport adds
    /// its acks).
    pub report: InboxReport,
    /// Why the [`Retry`](Verdict::Retry) messages were not committed (the database is down, a
    /// transient failure of an in-transaction handler); `None` when every message is settled.
    pub error: Option<OutboxError>,
    /// Dead letters written by this batch (a redelivered message found in the queue already
    /// is counted in `report.dead_lettered`, not here).
    pub(crate) new_dead_letters: usize,
}

impl Receipt {
    /// Dead letters this batch wrote (not counting messages found in the queue already).
    pub fn new_dead_letters(&self) -> usize {
        self.new_dead_letters
    }
}

/// What receiving did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxReport {
    /// Messages received.
    pub received: usize,
    /// Events committed into the outbox.
    pub appended: usize,
    /// Events whose id the outbox had already (redeliveries, re-publishes): skipped.
    pub duplicates: usize,
    /// Messages put in the dead letter queue (and terminated).
    pub dead_lettered: usize,
    /// Acks the broker confirmed.
    pub acked: usize,
    /// Acks not confirmed (the message will be redelivered and skipped as a duplicate).
    pub ack_failed: usize,
}

impl std::ops::AddAssign for InboxReport {
    fn add_assign(&mut self, o: Self) {
        self.received += o.received;
        self.appended += o.appended;
        self.duplicates += o.duplicates;
        self.dead_lettered += o.dead_lettered;
        self.acked += o.acked;
        self.ack_failed += o.ack_failed;
    }
}
