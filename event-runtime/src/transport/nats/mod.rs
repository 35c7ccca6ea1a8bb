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
//! 3. The consumer's inbox fetches a batch from a durable pull consumer and hands it to the
//!    transport-neutral [inbox core](crate::inbox) (`Outbox::receive`), which decodes each
//!    message through its registry and commits the batch once into its own outbox (event rows
//!    with their origin, delivery rows for its handlers; an event id already there is
//!    skipped); only then does the inbox acknowledge each message and wait for the server to
//!    confirm (double ack). Its engine runs its handlers with the usual guarantees.
//! 4. A message the inbox cannot accept is stored in the consuming service's dead letter queue
//!    (handler `nats-inbox:<durable>`, with its origin: transport `nats`, the stream as source,
//!    the stream sequence as position, the delivery count, attribute `subject`) and
//!    terminated, and the rest of its batch flows: one that does not decode
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
//! # Example
//! Wiring a relay into the producing service's outbox and an inbox into the consuming
//! service's (two processes in practice; `examples/billing` is a whole consumer):
//!
//! ```no_run
//! use event_core::DomainEvent;
//! use event_runtime::transport::nats::{self, InboxConfig, NatsInbox, NatsRelay, RelayConfig, StreamSpec};
//! use event_runtime::{CancellationToken, Dispatcher, Outbox, OutboxConfig, Store};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.placed", version = 1)]
//! struct OrderPlaced {
//!     #[event(aggregate_id)]
//!     order_id: String,
//! }
//!
//! # #[allow(dead_code)]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The producer: events committed through its outbox are published to `events.<name>`.
//! let client = nats::connect("nats://127.0.0.1:4222", "orders").await?;
//! StreamSpec::new("EVENTS").create(&async_nats::jetstream::new(client.clone())).await?;
//! let relay = NatsRelay::new(client, RelayConfig::new("EVENTS"));
//! let orders = Outbox::builder(Store::connect("sqlite://orders.db").await?)
//!     .dispatcher(Dispatcher::builder_empty().event::<OrderPlaced>())
//!     .destination(relay.clone())
//!     .config(OutboxConfig::default().source("urn:example:orders"))
//!     .build()?;
//! relay.check(&orders).await?; // until it passes, the relay delivers nothing
//! let publishing = orders.spawn_workers(2);
//!
//! // The consumer: received events are committed into its own outbox, whose workers run
//! // its handlers.
//! let client = nats::connect("nats://127.0.0.1:4222", "billing").await?;
//! let billing = Outbox::builder(Store::connect("sqlite://billing.db").await?)
//!     .dispatcher(Dispatcher::builder_empty().event::<OrderPlaced>())
//!     .build()?;
//! let inbox = NatsInbox::new(
//!     &async_nats::jetstream::new(client),
//!     billing.clone(),
//!     InboxConfig::new("EVENTS", "billing").batch(256),
//! )
//! .await?;
//! let handling = billing.spawn_workers(2);
//! // Until cancelled, or a verdict about the broker's data (an error: never a partial success).
//! let received = inbox.run(CancellationToken::new(), None).await?;
//! # let _ = (received, publishing, handling);
//! # Ok(())
//! # }
//! ```
//!
//! # When the broker has trouble
//! Nothing ends in a silent success. The relay pauses — no attempt used, nothing
//! dead-lettered — while the server is unreachable or the stream is missing, has no leader or
//! (clustered) lost its quorum, and resumes by itself.
//!
//! On a cluster (`connect` with the servers comma-separated, a stream of 3 replicas:
//! [`StreamSpec::replicas`]) the loss of any one server — the stream's leader, the consumer's
//! leader, the server a client is connected to — loses nothing and reorders nothing: the
//! clients reconnect to another server, the stream and the consumer elect new leaders, the
//! relay sends again what the election swallowed (same `Nats-Msg-Id`), and the inbox's
//! unconfirmed acks come back as redeliveries it skips. Resuming takes seconds (measured in
//! BENCHMARKS.md); [`FAILOVER_ALLOWANCE`] bounds it, and the inbox requires a gap wait above
//! it. The inbox records the stream's and the durable consumer's creation
//! times in the consuming store on its first start ([`InboxIdentity`](crate::InboxIdentity))
//! and stops with [`NatsError::IdentityChanged`] when the broker deleted or re-created either
//! (a wiped broker: events published before may never arrive), and with
//! [`NatsError::MessagesLost`] when the stream removed messages the consumer had not
//! acknowledged; `events nats inbox adopt` records a new identity once an operator has checked.
//! What the broker lost then shows as gaps in the consumer's aggregate chains (see
//! [the inbox core](crate::inbox#order-across-services)): a missing event still in the
//! stream is re-fetched with [`Refetch`] (`events inbox gaps refetch`), and one the broker
//! lost is published again by the producer ([`Store::republish`](crate::Store::republish),
//! `events relay republish`, same event ids: what the consumer has already is absorbed by the
//! stream's duplicate window or the inbox's de-duplication).
//! [`connect`] logs the connection's loss and return with the outage's length.
//!
//! Delivery is at-least-once on the wire and the outbox makes effects once: the stream drops
//! a re-publish within its duplicate window, and the inbox drops a redelivery, or a
//! re-publish after the window, for as long as the consuming outbox keeps the event row
//! ([`OutboxConfig::retention`](crate::OutboxConfig::retention): that is the inbox's
//! de-duplication window, checked at start-up to exceed the consumer's redelivery horizon).
//!
//! # Partitions
//! A stream of P partitions ([`StreamSpec::partitions`], `events nats stream create
//! --partitions P`) carries each event on its aggregate's partition: a token after the
//! subject's first one, `events.3.order.placed`. The partition is [`partition_of`] the
//! producer's aggregate type and id — XXH3-64 of `type ‖ 0x00 ‖ id`, mod P, stable across
//! processes, releases and platforms (pinned by fixed vectors; any language has XXH3) — so
//! every event of an aggregate takes one partition. The stream's description records P
//! (`partitions=P`); the relay ([`RelayConfig::partitions`]), the inbox
//! ([`InboxConfig::partitions`]) and the group check it at start-up and refuse another count
//! with [`NatsError::PartitionsMismatch`], naming both. One partition (the default) keeps the
//! subjects as they were, and a stream made before partitions existed counts as one. Each
//! partition is read by a durable consumer of its own ([`InboxConfig::partition`]; a
//! consumer's filter must fall within one of the stream's subjects): a [`NatsGroup`] runs
//! them, for one instance or many.
//!
//! A message whose subject's partition is not its aggregate's under the stream's count (a
//! producer still publishing with another count) is accepted — each aggregate's order is the
//! inbox core's chains' business, whatever partition its events came through — counted in
//! `events_nats_partition_mismatches_total` and logged at most once a minute with both
//! partitions.
//!
//! # A group of instances
//! [`NatsGroup`] runs one instance of a consuming service among several that share its
//! database: each renews a lease there (`event_inbox_members`, every quarter of
//! [`GroupConfig::lease`], default 10 s), computes the same assignment of the partitions over
//! the live instances ([`assign`]: rendezvous hashing with a bounded load, so that each
//! instance gets floor(P/N) or ceil(P/N)), and consumes each partition assigned to it through a
//! durable pull consumer of its own ([`partition_durable`]: `<durable>-<k>`, filtered on the
//! partition's subjects) once the instance that held it released it or its hold expired
//! (`event_inbox_partitions`). A partition no longer assigned to an instance is released
//! after the batch in hand is committed and acknowledged. So:
//! - an instance that starts takes its share within two rounds (half a lease) plus the batch
//!   in hand of the instances that give it up;
//! - an instance stopped with its cancellation token hands its partitions over at once;
//! - an instance killed without a word lets its partitions go when its lease expires, and
//!   the messages it held unacknowledged come back after the inbox's
//!   [`ack_wait`](InboxConfig::ack_wait): its aggregates flow again within the ack wait plus
//!   two leases; the other instances' aggregates never stop;
//! - an instance that cannot reach its database stops consuming once its lease would have
//!   expired, and takes part again when it can.
//!
//! Correctness never depends on the group: two instances consuming one partition for a
//! moment (a paused process whose lease lapsed) commit each event once and in each
//! aggregate's order all the same. `events nats group status DURABLE` shows the instances,
//! their leases, the holder of each partition and each partition's lag (`tests/tests/
//! nats_group.rs` measures the hand-overs; BENCHMARKS.md has the times and throughput).
//!
//! ```no_run
//! # use event_runtime::transport::nats::{self, GroupConfig, InboxConfig, NatsGroup};
//! # use event_runtime::{CancellationToken, Outbox};
//! # #[allow(dead_code)]
//! # async fn run(billing: Outbox) -> Result<(), Box<dyn std::error::Error>> {
//! let client = nats::connect("nats://127.0.0.1:4222", "billing").await?;
//! let group = NatsGroup::new(
//!     &async_nats::jetstream::new(client),
//!     billing,
//!     InboxConfig::new("EVENTS", "billing").partitions(8).batch(256),
//!     GroupConfig::new(), // lease 10 s, a member name of its own
//! )?;
//! group.run(CancellationToken::new(), None).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Changing the partitions
//! From P to Q on a running pair, nothing lost and nothing reordered (`tests/tests/
//! nats_group.rs` runs it from 1 to 4 under load):
//! 1. `events nats stream repartition EVENTS --partitions Q` ([`StreamSpec::repartition`]):
//!    the stream records Q and captures Q's subjects besides its old ones.
//! 2. Restart the consuming instances with Q (as a group). From 1 partition, the group's
//!    holder of partition 0 also drains the single inbox's consumer (the durable name itself)
//!    for as long as it exists.
//! 3. Restart the producers with Q. Events an old producer publishes meanwhile are accepted
//!    (counted as on another partition when P > 1); each aggregate's chain puts its events in
//!    order whichever consumer brings them.
//! 4. Once every producer publishes with Q: `events nats stream repartition EVENTS
//!    --partitions Q --prune` (only Q's subjects). From 1 partition, delete the old consumer
//!    once `events nats group status` shows nothing pending on it.
//!
//! Going down (Q < P), partitions P-1 … Q keep what was published to them: pause the
//! producers' relays (`events handler pause nats:EVENTS` on each producer's database), wait
//! until `events nats group status` shows no lag, then follow the steps. The repartition
//! refuses to go down while a consumer of a partition from Q up holds messages.
//!
//! The old consumer of step 4 is deleted with NATS's own tool (`nats consumer rm EVENTS
//! billing`): the group sees it gone and stops draining it (its recorded identity stays, for
//! `events nats inbox show`).
//!
//! # Metrics
//! Through the `metrics` crate, next to the engine's (crate docs):
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `events_nats_published_total` | counter | publishes the server acknowledged (a duplicate ack included) |
//! | `events_nats_published_duplicates_total` | counter | of those, acks saying the stream already held the message id |
//! | `events_nats_publish_failures_total` | counter, label `reason` | `unavailable` (not connected, or the publish's connection was lost: the relay pauses), `no_stream` (no stream takes the subject, it has no leader or no quorum, or a time-out during an election or with a replica away: the relay pauses), `timeout` (retried), `too_large` (dead letter), `other` (retried) |
//! | `events_nats_in_flight` | gauge | publishes sent and not yet acknowledged, in this process |
//! | `events_destination_oldest_pending_age_seconds{destination="nats:<stream>"}` | gauge | the lag: age in seconds of the oldest committed event the broker has not acknowledged yet (0 when none), set by the outbox's workers every [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval) (5 s) |
//! | `events_nats_received_total` | counter | messages an inbox fetched |
//! | `events_nats_duplicates_total` | counter | of those, event ids the consuming outbox already held (skipped) |
//! | `events_nats_acked_total` | counter | messages acknowledged after their commit (ack confirmed) |
//! | `events_nats_naked_total` | counter | messages given back (the commit failed): redelivered after 1 s |
//! | `events_nats_terminated_total` | counter | messages terminated after being stored as dead letters |
//! | `events_nats_dead_lettered_total` | counter | messages stored in the dead letter queue (cannot be accepted) |
//! | `events_nats_partition_mismatches_total` | counter | messages on a partition their aggregate does not belong to (accepted) |
//! | `events_nats_group_partitions_held` | gauge, label `group` | partitions this instance of a group consumes |
//!
//! The lag is the engine's per-destination gauge rather than one of the relay's own: it is
//! read from the store (the pending deliveries), so it counts what this process has not
//! claimed yet and what another process or a crashed one left, keeps growing while the
//! broker is unreachable and the relay is paused (when the relay publishes nothing it could
//! time), and is the same gauge for every other destination.
//!
//! # Limitations
//! - Several inbox instances may share one durable consumer and one database: the inbox
//!   core's chains keep each aggregate's order whatever order the instances commit in, but
//!   an instance that dies holding messages delays every aggregate among them until the
//!   server redelivers (the ack wait). A partitioned stream and a [group](#a-group-of-instances)
//!   bound that to the dead instance's share.
//! - A group's instances share one database and compare lease times written by their own
//!   clocks: keep them within a small part of the lease (NTP).
//! - A lost *last* event of an aggregate is not visible to the consumer: a gap shows only
//!   when a later event of that aggregate arrives. After a broker is known to have lost
//!   data, re-publish from the producer with `events relay republish --since T`, T before
//!   the loss.

mod cluster;
mod group;
mod inbox;
use super::partition;
mod relay;
mod stream;
mod topology;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use group::{partition_durable, GroupConfig, NatsGroup};
pub use inbox::{
    InboxConfig, InboxReport, NatsInbox, ReceivedBatch, Refetch, RefetchOutcome, RefetchReport,
    RefetchedGap, FAILOVER_ALLOWANCE, IDENTITY_CHECK_INTERVAL,
};
pub use partition::{assign, partition_of, MAX_PARTITIONS};
pub use relay::{NatsRelay, RelayConfig};
pub use stream::{StreamShape, StreamSpec};

use crate::{OutboxError, StoreError};

/// The `Content-Type` of a CloudEvents structured-mode message with a JSON event format.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Why a NATS operation or a start-up check failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// Connecting failed ([`connect`]): the server is not reachable at that URL, or refused
    /// the client.
    ///
    /// async-nats prints a cause inside its own message and returns it again as the source:
    /// printed here once, with no source.
    #[error("{component}: cannot connect to NATS at {url}: {error}")]
    Connect {
        /// Which part of the application connected (the client's name).
        component: String,
        /// The URL, credentials masked.
        url: String,
        /// Why (the operating system's, TLS's or the server's error).
        error: async_nats::Error,
    },
    /// Talking to the server failed. async-nats prints a cause inside its own message and
    /// returns it again as the source: printed here once, with no source.
    #[error("NATS: {0} failed: {1}")]
    Broker(&'static str, async_nats::Error),

    /// The stream or the durable consumer an inbox consumes is not the one it recorded in its
    /// store on its first start: deleted, or deleted and created anew (a wiped or replaced
    /// broker). Messages published before may never arrive, so the inbox stops rather than
    /// report a partial result as complete. Record the new identity with
    /// `events nats inbox adopt` ([`Store::adopt_inbox_identity`](crate::Store::adopt_inbox_identity));
    /// then the events the broker lost show as gaps, which the producer closes by publishing
    /// them again (`events relay republish`, [`Store::republish`](crate::Store::republish)).
    #[error("inbox `{inbox}`: the broker no longer has what it consumed (recorded: {recorded}; found: {found}); events published before may never arrive: record the new identity with `events nats inbox adopt`, then have the producer publish again what was lost (`events relay republish`)")]
    IdentityChanged {
        /// The inbox (`nats-inbox:<durable>`).
        inbox: String,
        /// What the store recorded.
        recorded: String,
        /// What the server has now.
        found: String,
    },
    /// The stream removed messages the inbox's consumer had not acknowledged: its first
    /// sequence passed the consumer's ack floor (the stream's limits, a purge, lost storage).
    #[error("inbox `{inbox}`: stream `{stream}` starts at sequence {first_sequence}, but the consumer acknowledged only up to {ack_floor}: messages {} to {} were removed before they were received", ack_floor + 1, first_sequence - 1)]
    MessagesLost {
        /// The inbox (`nats-inbox:<durable>`).
        inbox: String,
        /// The stream.
        stream: String,
        /// The stream's first sequence now.
        first_sequence: u64,
        /// The consumer's ack floor (stream sequence).
        ack_floor: u64,
    },
    /// No stream of that name.
    #[error("there is no JetStream stream `{0}` on the server (check the name and the server URL; to create it: StreamSpec::create or `events nats stream create`)")]
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
    /// A relay or an inbox configured for one count of partitions, and a stream that has
    /// another ([`StreamSpec::partitions`]): the relay would publish where no partition
    /// consumer reads, an inbox would read subjects nobody publishes to.
    #[error("{what} is configured for {configured} partition(s), and stream `{stream}` has {found} (its description's `partitions=`; 1 when it has none): configure the same count, or change the stream's with the procedure in the docs (`events nats stream repartition`)")]
    PartitionsMismatch {
        /// The stream.
        stream: String,
        /// Which side is configured so: `the relay nats:EVENTS`, `inbox group billing`.
        what: String,
        /// The count configured.
        configured: u32,
        /// The stream's count.
        found: u32,
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
    #[error("invalid NATS configuration: {0}")]
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

    /// A verdict about the broker's data that waiting will not change
    /// ([`IdentityChanged`](Self::IdentityChanged), [`MessagesLost`](Self::MessagesLost)): a
    /// consuming service stops on it instead of retrying.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            NatsError::IdentityChanged { .. } | NatsError::MessagesLost { .. }
        )
    }
}

/// The broker's creation times of `stream` and of its durable consumer `durable` (`None`:
/// no such consumer), as an inbox records them (`events nats inbox show|adopt`).
#[cfg(feature = "cli")]
pub(crate) async fn observe_identity(
    js: &async_nats::jetstream::Context,
    stream: &str,
    durable: &str,
) -> Result<(String, Option<String>), NatsError> {
    let o = inbox::observe(js, stream, durable).await?;
    Ok((o.stream_created, o.consumer.map(|(created, _)| created)))
}

#[cfg(feature = "cli")]
pub(crate) use cluster::replica_trouble;

/// `url` with credentials masked (`nats://***@host:4222`), each server of a comma-separated
/// list alike.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let (scheme, rest) = match part.find("://") {
                Some(i) => part.split_at(i + 3),
                None => ("", part),
            };
            match rest.rfind('@') {
                Some(at) => format!("{scheme}***{}", &rest[at..]),
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Connects to NATS at `url` (one server, or a cluster's servers comma-separated:
/// `nats://127.0.0.1:4222,nats://127.0.0.1:4223`) as `component` (the client's name, shown by
/// the server and in every log line), reconnecting on its own — to any server of the cluster —
/// for as long as the client lives. The connection's life is logged through `tracing` with the
/// component and the URL (credentials masked): `NATS connection lost` (warn) when it drops,
/// `NATS connection back after …` (warn, so that a log showing the loss shows its end) with
/// the outage's length when it returns, and the server's and client's errors (warn; a failed
/// reconnect attempt during an outage at debug).
///
/// # Errors
/// [`NatsError::Connect`], naming `component` and the URL, when the first connection fails.
///
/// # Cancel safety
/// Cancel safe: dropped, no client exists.
pub async fn connect(url: &str, component: &str) -> Result<async_nats::Client, NatsError> {
    use async_nats::Event;
    let shown = redact_url(url);
    let lost: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let (who, at) = (component.to_owned(), shown.clone());
    let options = async_nats::ConnectOptions::new()
        .name(component)
        .event_callback(move |event| {
            let (lost, who, at) = (Arc::clone(&lost), who.clone(), at.clone());
            async move {
                match event {
                    Event::Disconnected => {
                        lost.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert_with(Instant::now);
                        tracing::warn!(component = %who, url = %at, "NATS connection lost: reconnecting");
                    }
                    Event::Connected => {
                        let since = lost.lock().unwrap_or_else(|e| e.into_inner()).take();
                        if let Some(since) = since {
                            let outage = since.elapsed();
                            // At the outage's level, so that a log showing the loss shows
                            // its end.
                            tracing::warn!(component = %who, url = %at, outage_s = outage.as_secs_f64(), "NATS connection back after {}", crate::outbox::pause::human(outage));
                        }
                    }
                    Event::LameDuckMode => {
                        tracing::warn!(component = %who, url = %at, "NATS server entering lame duck mode: it will close this connection soon")
                    }
                    Event::ServerError(e) => {
                        tracing::warn!(component = %who, url = %at, error = %e, "NATS server error")
                    }
                    Event::ClientError(e) => {
                        // Each failed reconnect attempt of an outage already logged as lost.
                        if lost.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                            tracing::debug!(component = %who, url = %at, error = %e, "NATS client error while reconnecting")
                        } else {
                            tracing::warn!(component = %who, url = %at, error = %e, "NATS client error")
                        }
                    }
                    Event::SlowConsumer(sid) => {
                        tracing::warn!(component = %who, url = %at, subscription = sid, "NATS slow consumer: messages dropped by the client")
                    }
                    Event::Draining | Event::Closed => {}
                }
            }
        });
    let connect_error = |error: async_nats::Error| NatsError::Connect {
        component: component.to_owned(),
        url: shown.clone(),
        error,
    };
    let servers = servers(url, component)
        .await
        .map_err(|e| connect_error(e.into()))?;
    options
        .connect(servers)
        .await
        .map_err(|e| connect_error(e.into()))
}

/// The servers of `url`, comma-separated (blanks around them and empty entries ignored):
/// async-nats takes a list of addresses, not one string holding several. It tries them in
/// turn, and learns the cluster's other servers from the one it reaches (their INFO
/// `connect_urls`) to reconnect to when that one dies. An entry that is not a NATS URL is
/// refused, naming it; a host name that does not resolve now is left out with a warning
/// naming it (async-nats would abort the whole connect on it, or not, depending on the
/// order it shuffled the list into), unless no entry is left.
async fn servers(url: &str, component: &str) -> Result<Vec<async_nats::ServerAddr>, String> {
    let entries: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(
            "no server given (a URL such as nats://127.0.0.1:4222, or several comma-separated)"
                .into(),
        );
    }
    let mut servers = Vec::new();
    let mut unresolved = Vec::new();
    for entry in entries {
        let addr: async_nats::ServerAddr = entry
            .parse()
            .map_err(|e| format!("`{}` is not a NATS server URL: {e}", redact_url(entry)))?;
        let host = match addr.host() {
            h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
            h => h.to_owned(),
        };
        let resolved = tokio::net::lookup_host(format!("{host}:{}", addr.port()))
            .await
            .map(drop);
        match resolved {
            Ok(()) => servers.push(addr),
            Err(e) => unresolved.push(format!("`{}` ({e})", redact_url(entry))),
        }
    }
    if servers.is_empty() {
        return Err(format!(
            "no server's host name resolves: {}",
            unresolved.join(", ")
        ));
    }
    if !unresolved.is_empty() {
        tracing::warn!(component, left_out = %unresolved.join(", "), "NATS servers left out: their host names do not resolve");
    }
    Ok(servers)
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
