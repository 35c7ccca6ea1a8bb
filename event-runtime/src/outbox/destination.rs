//! The destination boundary: where a delivery goes. A destination is a local handler (run by
//! the dispatcher) or something a transport provides ([`Destination`], a relay to a broker).
//! The engine claims, leases, orders, retries, pauses and dead-letters deliveries the same way
//! for both; only the call differs. Nothing here touches the store.
//!
//! A relay keeps each aggregate's chain for its consumers: every ordered delivery carries the
//! sequence of the previous event of its aggregate that the relay published
//! ([`Delivery::previous_sequence`], read from the store's `event_relay_chain` when the
//! delivery is claimed, written there when its publish completes), and a transport publishes
//! [`Delivery::wire_envelope`], which adds it as the CloudEvents extension attribute
//! `prevsequence`. A consuming inbox releases an event only after that predecessor.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_core::{EventDescriptor, HandlerError};
use tokio::sync::Semaphore;
use uuid::Uuid;

use super::retry::RetryPolicy;

/// One delivery, as an external [`Destination`] sees it: the stored envelope and where the
/// event sits in its aggregate's stream.
///
/// The engine makes them; a test of a destination makes one with [`Delivery::new`] and the
/// setters. `#[non_exhaustive]`: fields are added in minor releases.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Delivery<'a> {
    /// The event id: the idempotency key downstream (a broker's message id).
    pub event_id: Uuid,
    /// The event name (CloudEvents `type`).
    pub name: &'a str,
    /// The schema version the event was recorded with (never upcast for a destination).
    pub version: u32,
    /// The aggregate type.
    pub aggregate_type: &'a str,
    /// The aggregate id.
    pub aggregate_id: &'a str,
    /// The aggregate sequence (0 when unsequenced).
    pub sequence: u64,
    /// This attempt, from 1.
    pub attempt: u32,
    /// The CloudEvents JSON envelope, byte for byte as committed.
    pub envelope: &'a str,
    /// For a relay's ordered delivery: the sequence of the previous event of this aggregate
    /// that this destination published (`Some(0)`: none), read from the store when it is
    /// claimed, the same on every attempt. A transport puts it on the wire with
    /// [`wire_envelope`](Self::wire_envelope). `None` for an unsequenced event.
    pub previous_sequence: Option<u64>,
}

impl<'a> Delivery<'a> {
    /// The first attempt of event `event_id` named `name` (CloudEvents `type`) with its
    /// stored `envelope` (CloudEvents JSON): version 1, no aggregate, unsequenced.
    pub fn new(event_id: Uuid, name: &'a str, envelope: &'a str) -> Self {
        Delivery {
            event_id,
            name,
            version: 1,
            aggregate_type: "",
            aggregate_id: "",
            sequence: 0,
            attempt: 1,
            envelope,
            previous_sequence: None,
        }
    }

    /// With [`version`](Self::version) set.
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// With [`aggregate_type`](Self::aggregate_type) and [`aggregate_id`](Self::aggregate_id)
    /// set.
    pub fn aggregate(mut self, aggregate_type: &'a str, aggregate_id: &'a str) -> Self {
        self.aggregate_type = aggregate_type;
        self.aggregate_id = aggregate_id;
        self
    }

    /// With [`sequence`](Self::sequence) set (from 1; 0 when unsequenced).
    pub fn sequence(mut self, sequence: u64) -> Self {
        self.sequence = sequence;
        self
    }

    /// With [`attempt`](Self::attempt) set (from 1).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// With [`previous_sequence`](Self::previous_sequence) set.
    pub fn previous_sequence(mut self, previous: u64) -> Self {
        self.previous_sequence = Some(previous);
        self
    }

    /// The bytes to publish: the stored envelope with the CloudEvents extension attribute
    /// [`prevsequence`](event_core::PREVIOUS_SEQUENCE_ATTRIBUTE) (a string of digits) set to
    /// [`previous_sequence`](Self::previous_sequence), or the stored envelope itself when
    /// that is `None`. An envelope that carries the attribute already (an event this service
    /// received and forwards) has it replaced. The stored envelope is never changed.
    pub fn wire_envelope(&self) -> std::borrow::Cow<'a, str> {
        match self.previous_sequence {
            Some(previous) => with_previous_sequence(self.envelope, previous),
            None => std::borrow::Cow::Borrowed(self.envelope),
        }
    }
}

/// `envelope` (a JSON object) with `prevsequence` set to `previous`; unchanged when it is
/// not a JSON object.
fn with_previous_sequence(envelope: &str, previous: u64) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let name = event_core::PREVIOUS_SEQUENCE_ATTRIBUTE;
    if envelope.contains(&format!("\"{name}\"")) {
        // Rare (a forwarded event): parsed and written again.
        return match serde_json::from_str::<serde_json::Value>(envelope) {
            Ok(serde_json::Value::Object(mut map)) => {
                map.insert(name.into(), serde_json::Value::String(previous.to_string()));
                Cow::Owned(serde_json::Value::Object(map).to_string())
            }
            _ => Cow::Borrowed(envelope),
        };
    }
    let Some(rest) = envelope.trim_start().strip_prefix('{') else {
        return Cow::Borrowed(envelope);
    };
    let attribute = format!("\"{name}\":\"{previous}\"");
    if rest.trim_start().starts_with('}') {
        Cow::Owned(format!("{{{attribute}{rest}"))
    } else {
        Cow::Owned(format!("{{{attribute},{rest}"))
    }
}

/// Why an external delivery did not succeed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeliveryError {
    /// It failed: retried with the destination's backoff when transient, dead-lettered at once
    /// when permanent ([`HandlerError::permanent`]).
    Failed(HandlerError),
    /// The destination cannot take deliveries now (its broker is unreachable): the delivery is
    /// given back without using an attempt, and the destination is paused — in the store, for
    /// every worker — until [`Destination::available`] says it is back, checked every
    /// `retry_after`. An outage of any length loses nothing and dead-letters nothing.
    Unavailable {
        /// What is wrong, for logs and `events handler list`.
        reason: String,
        /// How long before looking again.
        retry_after: Duration,
    },
}

impl DeliveryError {
    /// `error.type` of a span this failure ends: `unavailable`, `permanent` or `transient`.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn error_type(&self) -> &'static str {
        match self {
            DeliveryError::Unavailable { .. } => "unavailable",
            DeliveryError::Failed(e) if e.is_permanent() => "permanent",
            DeliveryError::Failed(_) => "transient",
        }
    }
}

impl<E: Into<HandlerError>> From<E> for DeliveryError {
    fn from(e: E) -> Self {
        DeliveryError::Failed(e.into())
    }
}

/// How a destination receives an event, as [`Destination::route`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing {
    /// Whether its deliveries keep per-aggregate order (one at a time per aggregate, a
    /// failure holding back the later events of the aggregate).
    pub ordered: bool,
}

/// A destination provided by a transport: deliveries of the events it routes are written at
/// commit, in the same transaction, and delivered by the engine outside any database
/// transaction, concurrently across aggregates, in order within one.
///
/// Its name is stored in the `handler` column of each delivery, as a handler's is, so it must
/// not be a handler's name, and must never change while deliveries to it may be pending.
/// Name it `TRANSPORT:…` (the NATS relay's default is `nats:<stream>`): the `events` tool
/// takes a name of that form (a lower-case word and a single `:`) for a relay, shows it as
/// one, and refuses to purge or re-target its pending deliveries (events not yet published)
/// unless forced.
///
/// # Examples
///
/// A destination that posts each event of the `order` aggregate to a webhook (here a channel
/// stands in for the HTTP client), added to the outbox with
/// [`OutboxBuilder::destination`](crate::OutboxBuilder::destination):
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use event_core::{DomainEvent, EventDescriptor, EventRecorder, HandlerError};
/// use event_runtime::{Delivery, DeliveryError, Destination, Outbox, Routing, Store};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 1)]
/// struct OrderPlaced { #[event(aggregate_id)] order_id: String }
///
/// /// Stands in for an HTTP client.
/// #[derive(Default)]
/// struct Webhook { received: Mutex<Vec<String>> }
///
/// impl Webhook {
///     async fn post(&self, idempotency_key: &str, body: &str) -> Result<(), std::io::Error> {
///         assert!(body.contains("order.placed"));
///         self.received.lock().unwrap().push(idempotency_key.to_owned());
///         Ok(())
///     }
/// }
///
/// #[async_trait]
/// impl Destination for Webhook {
///     fn name(&self) -> &str {
///         "webhook:orders"
///     }
///
///     fn route(&self, event: &EventDescriptor) -> Option<Routing> {
///         (event.aggregate_type == "order").then_some(Routing { ordered: true })
///     }
///
///     async fn deliver(&self, delivery: &Delivery<'_>) -> Result<(), DeliveryError> {
///         if delivery.attempt > 5 {
///             return Err(HandlerError::permanent_msg("the webhook keeps failing").into());
///         }
///         // The event id is the idempotency key downstream; `?` makes an I/O error a
///         // transient failure, retried with backoff.
///         self.post(&delivery.event_id.to_string(), delivery.envelope).await?;
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let path = std::env::temp_dir().join(format!("destination-doc-{}.db", uuid::Uuid::now_v7()));
/// # let url = format!("sqlite://{}", path.display());
/// let webhook = Arc::new(Webhook::default());
/// let outbox = Outbox::builder(Store::connect(&url).await?)
///     .destination(webhook.clone())
///     .build()?;
///
/// let mut uow = outbox.begin().await?;
/// let mut recorder = EventRecorder::new();
/// recorder.record(OrderPlaced { order_id: "A-1".into() });
/// uow.extend(recorder.take());
/// uow.commit().await?;
///
/// outbox.drain(Duration::from_secs(10)).await?;
/// assert_eq!(webhook.received.lock().unwrap().len(), 1);
/// # drop(outbox); std::fs::remove_file(path).ok();
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Destination: Send + Sync + 'static {
    /// The name deliveries to it are stored under.
    fn name(&self) -> &str;

    /// Whether events of `event` go to this destination, and how: called once per registered
    /// event type at start-up.
    fn route(&self, event: &EventDescriptor) -> Option<Routing>;

    /// Delivers one. Returning `Ok` completes the delivery: only return it once the
    /// receiver has taken the event for good (a broker's publish acknowledgement).
    ///
    /// # Cancel safety
    /// The engine drops the future when the time limit passes or on an aborted shutdown; the
    /// delivery is then attempted again (at-least-once), with the same event id.
    async fn deliver(&self, delivery: &Delivery<'_>) -> Result<(), DeliveryError>;

    /// Whether a destination paused by [`DeliveryError::Unavailable`] can take deliveries
    /// again. Default: yes (the pause lasts one `retry_after`).
    async fn available(&self) -> bool {
        true
    }

    /// Its options; `None` takes the outbox's.
    fn retry_policy(&self) -> Option<RetryPolicy> {
        None
    }

    /// Its time limit per delivery; `None` takes the outbox's.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// How many of its deliveries one worker has in flight at once (one per aggregate);
    /// `None` takes the outbox's concurrency.
    fn concurrency(&self) -> Option<usize> {
        None
    }
}

/// Whether `name` has the form of a transport's relay: `TRANSPORT:REST` (`nats:orders`),
/// `TRANSPORT` a word of lower-case ASCII letters, digits, `-` and `_` that starts with a
/// letter, followed by a single `:`. A handler's default name is its module path
/// (`shop::mail::send`: double colons) and a pinned one follows the dotted convention
/// (`billing.on_order_placed`), so neither takes this form; where a registry is at hand, a
/// registered handler is never taken for a relay (the `events` tool checks that too).
pub(crate) fn relay_name(name: &str) -> bool {
    let Some((transport, rest)) = name.split_once(':') else {
        return false;
    };
    transport.starts_with(|c: char| c.is_ascii_lowercase())
        && transport
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !rest.is_empty()
        && !rest.starts_with(':')
}

/// What a claimed delivery's destination is, to the engine.
pub(crate) enum Target {
    /// A local handler: the dispatcher's index.
    Handler {
        index: u32,
        /// It takes the transaction: runs inside the batch transaction, in a savepoint.
        transactional: bool,
    },
    /// A transport's destination.
    External(Arc<dyn Destination>),
}

/// A destination with its resolved options.
pub(crate) struct Resolved {
    pub(crate) name: String,
    pub(crate) target: Target,
    pub(crate) retry: RetryPolicy,
    pub(crate) timeout: Duration,
    /// Limits the runs of this destination in flight in one worker process.
    pub(crate) permits: Arc<Semaphore>,
    /// Its circuit breaker (handlers only).
    pub(crate) breaker: Option<super::breaker::CircuitBreaker>,
}

impl Resolved {
    /// Runs outside any transaction, concurrently.
    pub(crate) fn is_external(&self) -> bool {
        !matches!(
            self.target,
            Target::Handler {
                transactional: true,
                ..
            }
        )
    }
}
