//! RabbitMQ (feature `rabbitmq`, AMQP 0-9-1 on [`lapin`]): the relay ([`AmqpRelay`]) publishes
//! committed events from the outbox to an exchange with publisher confirms, and the inbox
//! ([`AmqpInbox`]) commits what a queue delivers into a consuming service's outbox through the
//! [inbox core](crate::inbox). Works with RabbitMQ 3.10 and later.
//!
//! # The path of an event
//! 1. The producer commits an event that the relay routes ([`RelayConfig`]): its outbox row and
//!    a delivery to the relay are written in the same transaction.
//! 2. The engine delivers it: the relay publishes the envelope as a CloudEvents
//!    structured-mode message (CloudEvents AMQP protocol binding 1.0, §3.2: the body is the
//!    envelope JSON, the AMQP `content-type` property `application/cloudevents+json`) to the
//!    exchange with the routing key `<prefix>.<event name>` (`events.order.placed`),
//!    persistent (`delivery-mode` 2), `message-id` = the event id, mandatory, and completes the
//!    delivery when the broker confirms it (publisher confirms: the broker has stored it in
//!    every queue it was routed to). At most one publish per aggregate is unconfirmed (the
//!    engine's per-aggregate order); different aggregates are pipelined on one channel up to
//!    [`RelayConfig::in_flight`]. The envelope carries its aggregate's chain (`prevsequence`)
//!    as on NATS, so that a consumer's inbox applies each aggregate's events in order whatever
//!    order the queues deliver them in.
//!
//! # When the broker has trouble
//! Nothing ends in a silent success, and nothing that is the broker's fault uses an attempt:
//! - the broker unreachable, or the connection lost: the relay pauses
//!   ([`DeliveryError::Unavailable`](crate::DeliveryError::Unavailable): in the store, for
//!   every worker, no attempt used) and reconnects when
//!   [`Destination::available`](crate::Destination::available) finds the broker again,
//!   asked every second;
//! - the exchange missing (the broker closes the channel with 404 NOT_FOUND), or the message
//!   returned as unroutable (no queue bound for its routing key: broken topology, as a
//!   missing stream on NATS): the relay pauses until the exchange exists and takes the
//!   message (asked every 5 s);
//! - the channel closed by the broker for another reason: every publish unconfirmed on it is
//!   given back without using its attempt (a short pause), and the channel is reopened;
//! - the broker blocking publishers (`connection.blocked`: a memory or disk alarm): the relay
//!   pauses and says why (a warning naming the broker), and publishes again once the alarm
//!   clears; a publish held back by an alarm that began while it was in flight uses no
//!   attempt either;
//! - a nack (the broker could not store the message: a queue that rejects publishes when
//!   full, say) is a transient failure, retried with [`RelayConfig::retry`] and dead-lettered
//!   when the attempts run out;
//! - no confirm within [`RelayConfig::publish_timeout`]: retried (the broker may have stored
//!   it: RabbitMQ has no de-duplication, so the consumer's inbox drops the second copy by its
//!   event id).
//!
//! Every error and log line names the broker's URL without its password ([`redact_url`]).
//!
//! # Consuming
//! [`BrokerTopology`] declares (or checks) a consuming service's queues, one per partition;
//! an [`AmqpInbox`] consumes one queue, and an [`AmqpGroup`] is one instance of a group that
//! shares every partition queue with the other instances on its database through the inbox
//! core's leases ([`GroupConfig`](crate::inbox::GroupConfig)). A queue keeps nothing it
//! delivered, so a gap in an aggregate's chain cannot be re-fetched from it (`events inbox
//! gaps refetch` says so): re-publish from the producer (`events relay republish`) or accept
//! the gap.
//!
//! ```no_run
//! use event_runtime::transport::rabbitmq::{AmqpInbox, BrokerTopology};
//! use event_runtime::{CancellationToken, Outbox, Store};
//!
//! # #[allow(dead_code)]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! // The exchange `events`, the queue `billing` bound to `events.order.#`, its parking queue.
//! let topology = BrokerTopology::new("events", "billing").bindings(["order.#"]);
//! topology.create(url).await?;
//! let outbox = Outbox::builder(Store::connect("sqlite://billing.db").await?).build()?;
//! let _workers = outbox.spawn_workers(2);
//! let inbox = AmqpInbox::new(url, outbox, topology.inbox_config(0)).await?;
//! let report = inbox.run(CancellationToken::new(), None).await?;
//! # let _ = report;
//! # Ok(())
//! # }
//! ```
//!
//! lapin logs a message the broker returns as unroutable at WARN, body included (target
//! `lapin::returned_messages`): add the directive `lapin::returned_messages=off` to the
//! service's filter (after `RUST_LOG`, so that no setting brings it back) where payloads must
//! stay out of logs. The relay logs the return itself, without the body.
//!
//! # TLS
//! `amqps://` URLs need the feature `rabbitmq-tls` (rustls with the ring provider; the
//! server's certificate is verified against the platform's roots). Without it an `amqps://`
//! URL is refused with [`AmqpError::Connect`] saying so: never a connection in the clear.

mod group;
mod inbox;
mod queues;
mod relay;
mod topology;

pub use group::AmqpGroup;
pub use inbox::{AmqpInbox, Committed, InboxConfig};
pub use queues::BrokerTopology;
pub use relay::{AmqpRelay, RelayConfig};

/// The AMQP `content-type` of every message the relay publishes: a CloudEvents
/// structured-mode JSON event (CloudEvents AMQP protocol binding 1.0, §3.2).
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Why a RabbitMQ operation failed. Each names the broker's URL without its password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The broker could not be reached, or refused the connection (credentials, virtual
    /// host).
    #[error("cannot connect to RabbitMQ at {url}")]
    Connect {
        /// The URL, password masked.
        url: String,
        /// Why.
        #[source]
        source: lapin::Error,
    },
    /// The exchange the relay publishes to does not exist.
    #[error("RabbitMQ at {url} has no exchange `{exchange}`: declare it (`events rabbitmq topology create`) before the relay publishes")]
    NoExchange {
        /// The URL, password masked.
        url: String,
        /// The exchange.
        exchange: String,
    },
    /// The queue an inbox consumes does not exist (never declared, or deleted while it ran).
    #[error("RabbitMQ at {url} has no queue `{queue}`: declare it and bind it before the inbox consumes it")]
    NoQueue {
        /// The URL, password masked.
        url: String,
        /// The queue.
        queue: String,
    },
    /// The broker holds another number of partition queues for the consumer than the
    /// topology's: a consumer with fewer would leave the others' messages unread, one with
    /// more would wait for queues nobody publishes to.
    #[error("RabbitMQ at {url}: consumer `{consumer}` has {found} partition queue(s) on the broker, not {configured}: use {found} (and the same count on the relay), or drain and delete its queues before creating {configured}")]
    PartitionsMismatch {
        /// The URL, password masked.
        url: String,
        /// The consuming service.
        consumer: String,
        /// The topology's count.
        configured: u32,
        /// The count of queues found (`<consumer>` alone counts as 1).
        found: u32,
    },
    /// An exchange or queue exists with other settings than the topology's (RabbitMQ refuses
    /// the declaration: 406 PRECONDITION_FAILED, naming the setting).
    #[error("RabbitMQ at {url}: {what} exists with other settings: {detail}")]
    Mismatch {
        /// The URL, password masked.
        url: String,
        /// `queue `billing.3``, `exchange `events``.
        what: String,
        /// The broker's words (`inequivalent arg 'x-delivery-limit' for queue …`).
        detail: String,
    },
    /// A late redelivery would not be recognised as a duplicate: the consuming outbox's
    /// retention (its de-duplication window) does not exceed how long a message can keep
    /// coming back ([`InboxConfig::redelivery_bound`]).
    #[error("the outbox's retention ({retention:?}) must exceed the queue's redelivery bound ({bound:?}: (delivery limit + 1) × consumer timeout), or a late redelivery would not be recognised as a duplicate")]
    RetentionTooShort {
        /// The outbox's retention.
        retention: std::time::Duration,
        /// [`InboxConfig::redelivery_bound`].
        bound: std::time::Duration,
    },
    /// The configuration cannot work (an in-transaction handler behind an inbox).
    #[error("{0}")]
    Config(String),
    /// The consuming database failed (a group's lease or view).
    #[error("the consuming database failed")]
    Store(#[source] Box<crate::StoreError>),
    /// The consuming outbox failed to commit a batch (the batch was given back).
    #[error("the inbox could not commit the batch")]
    Outbox(#[source] crate::OutboxError),
    /// Another refusal of the broker.
    #[error("RabbitMQ at {url}: {what}")]
    Broker {
        /// The URL, password masked.
        url: String,
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: lapin::Error,
    },
}

/// How long connecting may take before the broker counts as unreachable.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to `url` within [`CONNECT_TIMEOUT`].
///
/// # Errors
/// [`AmqpError::Connect`], naming `url` without its password.
async fn connect(url: &str) -> Result<lapin::Connection, AmqpError> {
    open(url).await.map_err(|source| AmqpError::Connect {
        url: redact_url(url),
        source,
    })
}

/// Opens a connection to `url` within [`CONNECT_TIMEOUT`]; refuses `amqps://` unless the
/// feature `rabbitmq-tls` gives lapin a TLS implementation (without one, lapin would connect
/// in the clear to a TLS port, or to a plain one, and never say so).
async fn open(url: &str) -> Result<lapin::Connection, lapin::Error> {
    if url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
        && !cfg!(feature = "rabbitmq-tls")
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "amqps:// needs TLS: enable the feature `rabbitmq-tls` of event-runtime",
        )
        .into());
    }
    let connect = lapin::Connection::connect(url, lapin::ConnectionProperties::default());
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(connection) => connection,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
        )
        .into()),
    }
}

/// A new channel on `connection` (a refused declaration closes the one it was made on).
///
/// # Errors
/// [`AmqpError::Broker`], naming `url` (password masked).
async fn channel(connection: &lapin::Connection, url: &str) -> Result<lapin::Channel, AmqpError> {
    connection
        .create_channel()
        .await
        .map_err(|source| AmqpError::Broker {
            url: url.to_owned(),
            what: "opening a channel".into(),
            source,
        })
}

/// `url` with its password masked: `amqp://guest:***@127.0.0.1:5672/%2f`. A URL without a
/// password is returned as it is. Everything between the user name and the last `@` is
/// masked, so that a password holding an unescaped `/` or `@` is masked too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or("");
            if credentials.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else if credentials.contains('/') {
                // No `:` but a `/` before the `@`: not a user name; mask it all.
                format!("{scheme}://***@{host}")
            } else {
                format!("{scheme}://{user}@{host}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            redact_url("amqp://guest:s3cret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("amqp://a:b@c@host:5672"),
            "amqp://a:***@host:5672"
        );
        assert_eq!(redact_url("amqp://host:5672"), "amqp://host:5672");
        assert_eq!(redact_url("amqp://user@host"), "amqp://user@host");
        assert_eq!(
            redact_url("amqp://guest:Se/cret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("amqp://guest:a/b@c@host/v"),
            "amqp://guest:***@host/v"
        );
    }

    #[cfg(not(feature = "rabbitmq-tls"))]
    #[tokio::test]
    async fn amqps_without_tls_is_refused_before_connecting() {
        // Nothing listens on port 1: the refusal comes first.
        let e = connect("AMQPS://guest:secret@127.0.0.1:1/%2f")
            .await
            .unwrap_err();
        let shown = event_core::ErrorChain(&e).to_string();
        assert!(shown.contains("feature `rabbitmq-tls`"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
