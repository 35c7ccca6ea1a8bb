//! The relay: a [`Destination`] of the delivery engine that publishes each routed event to a
//! RabbitMQ exchange and completes its delivery on the publisher confirm. It must not order,
//! retry or batch on its own: the engine does (one delivery at a time per aggregate,
//! concurrently across aggregates, backoff, pauses, dead letters).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_core::{EventDescriptor, HandlerError};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ErrorKind, ExchangeKind};

use super::{redact_url, AmqpError, CONNECT_TIMEOUT, CONTENT_TYPE};
use crate::{Delivery, DeliveryError, Destination, RetryPolicy, Routing};

/// How long the relay stays paused while the broker is unreachable before it looks again.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// How long the relay stays paused on a broken topology (a missing exchange, an unroutable
/// message) before it looks again.
const TOPOLOGY_EVERY: Duration = Duration::from_secs(5);

/// How long the deliveries a closed channel lost wait before the reopened channel takes
/// them.
const REOPEN_AFTER: Duration = Duration::from_millis(200);

/// Which events the relay publishes, and with which routing keys: [`RelayConfig::new`],
/// changed with one setter per field.
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`new`](Self::new) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// The destination's name, stored with each delivery (default `amqp:<exchange>`): never
    /// change it while deliveries to it may be pending.
    pub name: String,
    /// The exchange the relay publishes to (a durable topic exchange, declared by the
    /// topology, never by the relay).
    pub exchange: String,
    /// The first routing key token(s) (default `events`): an event `order.placed` is published
    /// with the routing key `events.order.placed`.
    pub routing_key_prefix: String,
    /// The events that leave the service, by name; `None`: every registered event.
    pub events: Option<HashSet<String>>,
    /// A routing key per event name instead of `<prefix>.<name>`.
    pub routing_keys: HashMap<String, String>,
    /// The relay's retry policy (default: 6 attempts, 1 s doubling to 30 s). Losing the
    /// connection, a missing exchange and an unroutable message use no attempt.
    pub retry: RetryPolicy,
    /// How long to wait for the broker to confirm one publish (default 5 s). A time-out is
    /// ambiguous (the broker may have stored it): the retry publishes it again with the same
    /// `message-id`.
    pub publish_timeout: Duration,
    /// Publishes unconfirmed at once per worker process, each of another aggregate (default
    /// 64).
    pub in_flight: usize,
    /// The partitions of the consumers' queues (default 1: no partition token). With P > 1
    /// each event's routing key carries its aggregate's partition
    /// ([`partition_of`](crate::transport::partition_of) of the aggregate type and id) as a
    /// token after its first one, `events.3.order.placed`, which the topology binds to the
    /// consumer's queue of that partition ([`BrokerTopology`](super::BrokerTopology)).
    pub partitions: u32,
}

impl RelayConfig {
    /// Every event to the exchange `exchange` with the routing key `events.<name>`.
    pub fn new(exchange: impl Into<String>) -> Self {
        let exchange = exchange.into();
        RelayConfig {
            name: format!("amqp:{exchange}"),
            exchange,
            routing_key_prefix: "events".into(),
            events: None,
            routing_keys: HashMap::new(),
            retry: RetryPolicy {
                max_attempts: 6,
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(30),
            },
            publish_timeout: Duration::from_secs(5),
            in_flight: 64,
            partitions: 1,
        }
    }

    /// With [`name`](Self::name) set: the destination's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// With [`routing_key_prefix`](Self::routing_key_prefix) set.
    pub fn routing_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.routing_key_prefix = prefix.into();
        self
    }

    /// Only these events leave the service.
    pub fn only(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.events = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Publishes the event `name` with the routing key `key`.
    pub fn routing_key(mut self, name: impl Into<String>, key: impl Into<String>) -> Self {
        self.routing_keys.insert(name.into(), key.into());
        self
    }

    /// With [`retry`](Self::retry) set.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// With [`publish_timeout`](Self::publish_timeout) set.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// With [`in_flight`](Self::in_flight) set.
    pub fn in_flight(mut self, publishes: usize) -> Self {
        self.in_flight = publishes;
        self
    }

    /// With [`partitions`](Self::partitions) set (1 to
    /// [`MAX_PARTITIONS`](crate::transport::MAX_PARTITIONS)).
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions.clamp(1, crate::transport::MAX_PARTITIONS);
        self
    }

    /// The routing key of the event `name` without partition: `<prefix>.<name>`, or the key
    /// set for `name`.
    pub fn base_routing_key(&self, name: &str) -> String {
        match self.routing_keys.get(name) {
            Some(key) => key.clone(),
            None => format!("{}.{name}", self.routing_key_prefix),
        }
    }

    /// The routing key of an event `name` of the aggregate (`aggregate_type`,
    /// `aggregate_id`): the [base](Self::base_routing_key), with the aggregate's partition
    /// after its first token when partitioned (`events.3.order.placed`).
    pub fn routing_key_of(&self, name: &str, aggregate_type: &str, aggregate_id: &str) -> String {
        let key = self.base_routing_key(name);
        if self.partitions > 1 {
            let p = crate::transport::partition_of(aggregate_type, aggregate_id, self.partitions);
            crate::transport::partition::partitioned_subject(&key, p)
        } else {
            key
        }
    }
}

/// The RabbitMQ relay: add it to the outbox with
/// [`OutboxBuilder::destination`](crate::OutboxBuilder::destination). It connects when it
/// first publishes (or on [`check`](Self::check)) and again after a loss, on one channel in
/// confirm mode; see [the module](super) for what it publishes and what it does when the
/// broker has trouble.
///
/// ```no_run
/// use event_runtime::transport::rabbitmq::{AmqpRelay, RelayConfig};
/// use event_runtime::{Outbox, Store};
///
/// # #[allow(dead_code)]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let relay = AmqpRelay::new("amqp://guest:guest@127.0.0.1:5672/%2f", RelayConfig::new("events"));
/// relay.check().await?; // the exchange exists
/// let outbox = Outbox::builder(Store::connect("sqlite://orders.db").await?)
///     .destination(relay.clone())
///     .build()?;
/// let _workers = outbox.spawn_workers(2);
/// # Ok(())
/// # }
/// ```
pub struct AmqpRelay {
    url: String,
    shown: String,
    config: RelayConfig,
    link: tokio::sync::Mutex<Option<Link>>,
    /// Held while a publish is handed to the channel (see `publish`).
    sending: tokio::sync::Mutex<()>,
    /// The last message returned as unroutable: what [`Destination::available`] publishes
    /// again to learn whether the topology takes it now (see `available`).
    probe: std::sync::Mutex<Option<Probe>>,
    /// Whether the topology is broken (a missing exchange, an unroutable message) until a
    /// publish or a probe succeeds: a channel the broker closes meanwhile (the 404 of a publish
    /// in flight) pauses for as long as the broken topology does, not for a reopen.
    broken_topology: std::sync::atomic::AtomicBool,
}

/// A message the broker returned as unroutable, kept to ask the broker again with.
#[derive(Clone)]
struct Probe {
    event_id: uuid::Uuid,
    key: String,
    body: String,
    /// Published again and confirmed: its own delivery completes without another publish.
    confirmed: bool,
}

/// An open connection and its confirm-mode channel.
struct Link {
    /// Kept for the channel's sake (dropping it closes the connection), and reused when only
    /// the channel was closed.
    connection: Connection,
    channel: Channel,
}

impl std::fmt::Debug for AmqpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpRelay")
            .field("url", &self.shown)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a failed publish means.
enum Trouble {
    /// The broker cannot be reached, or the connection was lost.
    Unreachable(String),
    /// The exchange does not exist.
    Topology(String),
    /// The message was returned as unroutable: no queue is bound for its routing key.
    Unroutable(String),
    /// The channel was closed by the broker for another reason: give the delivery back.
    ChannelClosed(String),
    /// The broker blocks publishers (a memory or disk alarm): wait.
    Blocked(String),
    /// Anything else: retried with backoff.
    Other(String),
}

impl AmqpRelay {
    /// A relay to the broker at `url` (`amqp://user:password@host:port/vhost`, the virtual
    /// host URL-encoded: `%2f` is `/`) with `config`. Connects on first use.
    pub fn new(url: impl Into<String>, config: RelayConfig) -> Arc<AmqpRelay> {
        let url = url.into();
        Arc::new(AmqpRelay {
            shown: redact_url(&url),
            url,
            config,
            link: tokio::sync::Mutex::new(None),
            sending: tokio::sync::Mutex::new(()),
            probe: std::sync::Mutex::new(None),
            broken_topology: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Declares the exchange as the topology does (a durable topic exchange), for a producer
    /// that owns it; declaring it again changes nothing.
    ///
    /// # Errors
    /// [`AmqpError::Connect`]; [`AmqpError::Broker`] when the broker refuses (an exchange of
    /// that name with another type or durability: the broker's words say which).
    ///
    /// # Cancel safety
    /// Cancel safe: the declaration is one request.
    pub async fn declare_exchange(&self) -> Result<(), AmqpError> {
        let channel = self.channel().await.map_err(|source| AmqpError::Connect {
            url: self.shown.clone(),
            source,
        })?;
        channel
            .exchange_declare(
                self.config.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|source| AmqpError::Broker {
                url: self.shown.clone(),
                what: format!("declaring exchange `{}`", self.config.exchange),
                source,
            })
    }

    /// Connects (if not connected) and checks that the exchange exists, without declaring
    /// anything: a start-up check that fails with the reason instead of a relay that stays
    /// paused.
    ///
    /// # Errors
    /// [`AmqpError::Connect`] when the broker cannot be reached or refuses the connection,
    /// [`AmqpError::NoExchange`] when the exchange does not exist, [`AmqpError::Broker`] for
    /// another refusal.
    ///
    /// # Cancel safety
    /// Cancel safe: it declares nothing.
    pub async fn check(&self) -> Result<(), AmqpError> {
        let channel = self.channel().await.map_err(|source| AmqpError::Connect {
            url: self.shown.clone(),
            source,
        })?;
        match self.exchange_exists(&channel).await {
            Ok(()) => Ok(()),
            Err(e) if not_found(&e) => Err(AmqpError::NoExchange {
                url: self.shown.clone(),
                exchange: self.config.exchange.clone(),
            }),
            Err(source) => Err(AmqpError::Broker {
                url: self.shown.clone(),
                what: format!("checking exchange `{}`", self.config.exchange),
                source,
            }),
        }
    }

    /// A passive declaration of the exchange: an error when it is missing.
    async fn exchange_exists(&self, channel: &Channel) -> Result<(), lapin::Error> {
        let result = channel
            .exchange_declare(
                self.config.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        // A missing exchange closes the channel: the next use opens another
        // ([`channel`](Self::channel) looks at its state).
        result
    }

    /// The open confirm-mode channel, opened (with its connection, when that was lost) when
    /// there is none or the broker closed it.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref() {
            if l.channel.status().connected() && l.connection.status().connected() {
                return Ok(l.channel.clone());
            }
        }
        let connection = match link.take() {
            Some(l) if l.connection.status().connected() => l.connection,
            _ => super::open(&self.url).await?,
        };
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *link = Some(Link {
            connection,
            channel: channel.clone(),
        });
        Ok(channel)
    }

    /// Why the broker blocks publishers on the open connection (RabbitMQ's
    /// `connection.blocked`: a memory or disk alarm), if it does.
    async fn blocked(&self) -> Option<Trouble> {
        let link = self.link.lock().await;
        let blocked = link
            .as_ref()
            .is_some_and(|l| l.connection.status().blocked());
        blocked.then(|| {
            Trouble::Blocked(format!(
                "RabbitMQ at {} blocks publishers (a memory or disk alarm): waiting until it \
                 takes messages again",
                self.shown
            ))
        })
    }

    /// Publishes one delivery and waits for its confirm.
    async fn publish(&self, d: &Delivery<'_>) -> Result<(), Trouble> {
        let key = self
            .config
            .routing_key_of(d.name, d.aggregate_type, d.aggregate_id);
        self.send(&key, d.wire_envelope().as_bytes(), d.event_id)
            .await
    }

    /// Publishes `body` with the routing key `key` and waits for its confirm.
    async fn send(&self, key: &str, body: &[u8], event_id: uuid::Uuid) -> Result<(), Trouble> {
        let channel = self.channel().await.map_err(|e| {
            Trouble::Unreachable(format!("RabbitMQ at {} unreachable: {e}", self.shown))
        })?;
        if let Some(blocked) = self.blocked().await {
            return Err(blocked);
        }
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(event_id.to_string().into());
        let publish = async {
            // One publish at a time reaches the channel: lapin numbers a publish's confirm
            // and queues its frames in two steps, and two publishes racing between them
            // would take their numbers in one order and reach the broker in the other — an
            // ack for one would then confirm the other, and a connection lost between the two
            // would report as confirmed a message the broker never got. The confirms are
            // still awaited together.
            let confirm = {
                let _sending = self.sending.lock().await;
                channel
                    .basic_publish(
                        self.config.exchange.as_str().into(),
                        key.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        body,
                        properties,
                    )
                    .await?
            };
            confirm.await
        };
        let confirmation = match tokio::time::timeout(self.config.publish_timeout, publish).await {
            Err(_) => {
                // Held back by an alarm that began while it was in flight: not an attempt.
                if let Some(blocked) = self.blocked().await {
                    return Err(blocked);
                }
                return Err(Trouble::Other(format!(
                    "RabbitMQ at {} did not confirm the publish within {} ms",
                    self.shown,
                    self.config.publish_timeout.as_millis()
                )));
            }
            Ok(Err(e)) => return Err(self.classify(&e, key)),
            Ok(Ok(confirmation)) => confirmation,
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(Trouble::Unroutable(format!(
                    "RabbitMQ at {} returned the event as unroutable ({} {}): no queue is bound \
                     to exchange `{}` for routing key `{key}`",
                    self.shown, returned.reply_code, returned.reply_text, self.config.exchange
                )))
            }
            Confirmation::Nack(None) => Err(Trouble::Other(format!(
                "RabbitMQ at {} refused (nack) the publish to exchange `{}` with routing key \
                 `{key}`: a queue could not store it",
                self.shown, self.config.exchange
            ))),
            Confirmation::NotRequested => Err(Trouble::Other(format!(
                "RabbitMQ at {}: the channel is not in confirm mode",
                self.shown
            ))),
        }
    }

    /// Whether the delivery of `event_id` was published again by `available` and confirmed
    /// (forgetting it: once is enough).
    fn probed(&self, event_id: uuid::Uuid) -> bool {
        let mut probe = self.probe.lock().unwrap_or_else(|e| e.into_inner());
        match probe.as_ref() {
            Some(p) if p.event_id == event_id => {
                let confirmed = p.confirmed;
                *probe = None;
                confirmed
            }
            _ => false,
        }
    }

    fn classify(&self, e: &lapin::Error, key: &str) -> Trouble {
        if not_found(e) {
            return Trouble::Topology(format!(
                "RabbitMQ at {} has no exchange `{}` (routing key `{key}`): {e}",
                self.shown, self.config.exchange
            ));
        }
        match e.kind() {
            ErrorKind::IOError(_)
            | ErrorKind::InvalidConnectionState(_)
            | ErrorKind::RuntimeShutdownError(_)
            | ErrorKind::MissingHeartbeatError => {
                Trouble::Unreachable(format!("RabbitMQ at {}: connection lost: {e}", self.shown))
            }
            ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_) => {
                Trouble::ChannelClosed(format!(
                    "RabbitMQ at {}: the channel was closed: {e}",
                    self.shown
                ))
            }
            ErrorKind::ProtocolError(p) if matches!(p.kind(), AMQPErrorKind::Hard(_)) => {
                Trouble::Unreachable(format!(
                    "RabbitMQ at {} closed the connection: {e}",
                    self.shown
                ))
            }
            ErrorKind::ProtocolError(_) => Trouble::ChannelClosed(format!(
                "RabbitMQ at {} closed the channel: {e}",
                self.shown
            )),
            _ => Trouble::Other(format!("RabbitMQ at {}: {e}", self.shown)),
        }
    }
}

/// Whether `e` is the broker's 404 NOT_FOUND (a missing exchange), also when it reached this
/// publish as the state of the channel it closed.
pub(super) fn not_found(e: &lapin::Error) -> bool {
    match e.kind() {
        ErrorKind::ProtocolError(p) => {
            matches!(p.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
        }
        _ => e.to_string().contains("NOT_FOUND"),
    }
}

#[async_trait]
impl Destination for AmqpRelay {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        let wanted = self
            .config
            .events
            .as_ref()
            .is_none_or(|events| events.contains(event.name));
        wanted.then_some(Routing { ordered: true })
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        if self.probed(d.event_id) {
            // Published again by `available` and confirmed: the broker has it.
            return Ok(());
        }
        let trouble = match self.publish(d).await {
            Ok(()) => {
                self.broken_topology.store(false, Ordering::Relaxed);
                return Ok(());
            }
            Err(trouble) => trouble,
        };
        // Logged once per outage by the engine (`destination unavailable: paused`, with the
        // reason), not here once per publish in flight.
        let (reason, retry_after) = match trouble {
            Trouble::Unreachable(reason) | Trouble::Blocked(reason) => (reason, RECONNECT_EVERY),
            Trouble::Topology(reason) => {
                self.broken_topology.store(true, Ordering::Relaxed);
                (reason, TOPOLOGY_EVERY)
            }
            Trouble::ChannelClosed(reason) if self.broken_topology.load(Ordering::Relaxed) => {
                (reason, TOPOLOGY_EVERY)
            }
            Trouble::Unroutable(reason) => {
                self.broken_topology.store(true, Ordering::Relaxed);
                // Kept to ask the broker with: `available` publishes it again.
                let key = self
                    .config
                    .routing_key_of(d.name, d.aggregate_type, d.aggregate_id);
                *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(Probe {
                    event_id: d.event_id,
                    key,
                    body: d.wire_envelope().into_owned(),
                    confirmed: false,
                });
                (reason, TOPOLOGY_EVERY)
            }
            Trouble::ChannelClosed(reason) => (reason, REOPEN_AFTER),
            Trouble::Other(reason) => {
                return Err(DeliveryError::Failed(HandlerError::transient_msg(reason)))
            }
        };
        Err(DeliveryError::Unavailable {
            reason,
            retry_after,
        })
    }

    /// Whether the broker is back and the topology takes what it returned: connected, not
    /// blocking publishers, the exchange there, and the last message returned as unroutable
    /// (if any) published again and confirmed — its own delivery then completes without
    /// another publish. RabbitMQ has no way to ask whether a routing key is bound short of
    /// publishing to it.
    async fn available(&self) -> bool {
        let Ok(channel) = self.channel().await else {
            return false;
        };
        if self.blocked().await.is_some() || self.exchange_exists(&channel).await.is_err() {
            return false;
        }
        let probe = self.probe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let back = match probe {
            Some(p) if !p.confirmed => {
                let routed = self
                    .send(&p.key, p.body.as_bytes(), p.event_id)
                    .await
                    .is_ok();
                if routed {
                    if let Some(kept) = self
                        .probe
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_mut()
                        .filter(|k| k.event_id == p.event_id)
                    {
                        kept.confirmed = true;
                    }
                }
                routed
            }
            _ => true,
        };
        if back {
            self.broken_topology.store(false, Ordering::Relaxed);
        }
        back
    }

    fn retry_policy(&self) -> Option<RetryPolicy> {
        Some(self.config.retry)
    }

    fn timeout(&self) -> Option<Duration> {
        // The confirm's own limit, and the time to reconnect before it.
        Some(self.config.publish_timeout + CONNECT_TIMEOUT + Duration::from_secs(1))
    }

    fn concurrency(&self) -> Option<usize> {
        Some(self.config.in_flight)
    }
}
