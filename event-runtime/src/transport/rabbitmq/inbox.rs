//! The inbox: consumes one queue with manual acknowledgements and a bounded prefetch, hands
//! each batch to the transport-neutral [inbox core](crate::inbox) and acknowledges each
//! message only after the core committed it. It must not decode, de-duplicate or order on its
//! own: the core does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, Consumer};

use super::{redact_url, AmqpError};
use crate::inbox::{InboxReport, Incoming, Origin, Verdict};
use crate::{CancellationToken, Outbox};

/// How the inbox consumes: its queue and its batches. [`InboxConfig::new`], changed with one
/// setter per field.
///
/// `#[non_exhaustive]`: fields are added in minor releases, so build it from
/// [`new`](Self::new) and the setters, never with a struct literal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InboxConfig {
    /// The queue to consume (declared by the topology, never by the inbox).
    pub queue: String,
    /// The inbox's name: the handler of its dead letters (default `rabbitmq-inbox:<queue>`).
    /// Keep it: a new name is a new inbox to the dead letter queue.
    pub name: String,
    /// Messages committed at once, and the consumer's prefetch: the broker hands out at most
    /// this many unacknowledged (default 64, at most 65,535).
    pub batch: u16,
    /// How long a batch waits for more messages once the first is in (default 50 ms).
    pub batch_wait: Duration,
    /// How long one receive waits for a first message (default 1 s): the pace at which
    /// [`AmqpInbox::run`] looks at its cancellation and idle time.
    pub fetch_wait: Duration,
    /// The queue where the broker parks what it gave up on (default none; set by
    /// [`BrokerTopology::inbox_config`](super::BrokerTopology::inbox_config)): when set,
    /// [`AmqpInbox::run`] reports how many messages it holds every minute (the gauge
    /// `events_rabbitmq_parked_messages{queue}`, and a warning while it holds any).
    pub parking_queue: Option<String>,
    /// How long [`AmqpInbox::run`] holds a batch it could not commit (its database
    /// unreachable), unacknowledged, retrying the commit every second, before it gives the
    /// messages back (default 5 min). Held messages are neither redelivered nor counted
    /// toward the queue's delivery limit; each give-back counts once. Keep it under the
    /// broker's `consumer_timeout` (30 min by default), after which the broker closes the
    /// channel.
    pub hold_failed_batch: Duration,
    /// The queue's delivery limit (default 20, [`BrokerTopology`](super::BrokerTopology)'s:
    /// redeliveries before the broker parks a message).
    pub delivery_limit: u32,
    /// The broker's `consumer_timeout` (default 30 min, RabbitMQ's default): the longest a
    /// delivery stays with a consumer before it is given back.
    pub consumer_timeout: Duration,
    /// Whether the consuming outbox may register `in_transaction` handlers (default `false`:
    /// [`AmqpInbox::new`] refuses them): they run when a received event is committed, before a
    /// predecessor it waits for has arrived, so they see the broker's order.
    pub allow_in_transaction_handlers: bool,
}

impl InboxConfig {
    /// The queue `queue`, with the defaults above.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        InboxConfig {
            name: format!("rabbitmq-inbox:{queue}"),
            queue,
            batch: 64,
            batch_wait: Duration::from_millis(50),
            fetch_wait: Duration::from_secs(1),
            parking_queue: None,
            hold_failed_batch: Duration::from_secs(300),
            delivery_limit: 20,
            consumer_timeout: Duration::from_secs(30 * 60),
            allow_in_transaction_handlers: false,
        }
    }

    /// How long a message can keep coming back: ([`delivery_limit`](Self::delivery_limit) + 1)
    /// × [`consumer_timeout`](Self::consumer_timeout) (10.5 h by default: RabbitMQ parks a
    /// message when its returns exceed the limit, so it is delivered up to limit + 1 times). The consuming outbox's
    /// [`retention`](crate::OutboxConfig::retention) must exceed it, or a late redelivery
    /// would not be recognised as a duplicate: [`AmqpInbox::new`] checks.
    pub fn redelivery_bound(&self) -> Duration {
        self.consumer_timeout * (self.delivery_limit + 1)
    }

    /// With [`parking_queue`](Self::parking_queue) set.
    pub fn parking_queue(mut self, queue: impl Into<String>) -> Self {
        self.parking_queue = Some(queue.into());
        self
    }

    /// With [`hold_failed_batch`](Self::hold_failed_batch) set.
    pub fn hold_failed_batch(mut self, hold: Duration) -> Self {
        self.hold_failed_batch = hold;
        self
    }

    /// With [`delivery_limit`](Self::delivery_limit) set (at least 1).
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit.max(1);
        self
    }

    /// With [`consumer_timeout`](Self::consumer_timeout) set.
    pub fn consumer_timeout(mut self, timeout: Duration) -> Self {
        self.consumer_timeout = timeout;
        self
    }

    /// With [`name`](Self::name) set.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// With [`batch`](Self::batch) set (at least 1).
    pub fn batch(mut self, messages: u16) -> Self {
        self.batch = messages.max(1);
        self
    }

    /// With [`batch_wait`](Self::batch_wait) set.
    pub fn batch_wait(mut self, wait: Duration) -> Self {
        self.batch_wait = wait;
        self
    }

    /// With [`fetch_wait`](Self::fetch_wait) set.
    pub fn fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = wait;
        self
    }

    /// With [`allow_in_transaction_handlers`](Self::allow_in_transaction_handlers) set.
    pub fn allow_in_transaction_handlers(mut self, allow: bool) -> Self {
        self.allow_in_transaction_handlers = allow;
        self
    }
}

/// The RabbitMQ inbox: received events committed into this service's outbox, whose workers run
/// its handlers. Each message becomes an [`Incoming`] of transport `rabbitmq`, the queue as its
/// source, its delivery count (the quorum queue's `x-delivery-count` header plus one; 2 for a
/// redelivered message of a classic queue), and the attributes `exchange`, `routing_key`,
/// `queue` and `x-delivery-count`: a message the core refuses is a dead letter of this inbox
/// with that metadata, acknowledged so that the broker forgets it. A message is acknowledged
/// only after the batch holding it committed; one not acknowledged (a crash, a lost
/// connection) comes back, and the core skips it as a duplicate.
pub struct AmqpInbox {
    outbox: Outbox,
    config: InboxConfig,
    url: String,
    shown: String,
    link: tokio::sync::Mutex<Option<Link>>,
    /// Counts the messages fetched, for a group that watches its queues' activity.
    fetched: Option<Arc<AtomicU64>>,
}

/// An open connection, its channel and the consumer on the queue.
struct Link {
    connection: Connection,
    channel: Channel,
    consumer: Consumer,
}

impl std::fmt::Debug for AmqpInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpInbox")
            .field("url", &self.shown)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AmqpInbox {
    /// An inbox on `url` committing into `outbox`. Checks that the queue exists and that the
    /// outbox has no in-transaction handler (unless allowed), and starts consuming.
    ///
    /// # Errors
    /// [`AmqpError::Config`] for an in-transaction handler;
    /// [`AmqpError::RetentionTooShort`] when the outbox's retention does not exceed
    /// [`InboxConfig::redelivery_bound`]; [`AmqpError::Connect`];
    /// [`AmqpError::NoQueue`] when the queue does not exist; [`AmqpError::Broker`] when the
    /// broker refuses the consumer.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, the connection closes and nothing was received.
    pub async fn new(
        url: impl Into<String>,
        outbox: Outbox,
        config: InboxConfig,
    ) -> Result<AmqpInbox, AmqpError> {
        preflight(&outbox, &config)?;
        let url = url.into();
        let inbox = AmqpInbox {
            outbox,
            shown: redact_url(&url),
            url,
            config,
            link: tokio::sync::Mutex::new(None),
            fetched: None,
        };
        let link = inbox.open().await?;
        *inbox.link.lock().await = Some(link);
        Ok(inbox)
    }

    /// Counts the messages it fetches in `counter` (a group's activity).
    pub(super) fn count_fetched(mut self, counter: Arc<AtomicU64>) -> Self {
        self.fetched = Some(counter);
        self
    }

    /// Its configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// Connects, checks the queue and starts the consumer.
    async fn open(&self) -> Result<Link, AmqpError> {
        let connection = super::connect(&self.url).await?;
        let broker = |what: &str| {
            let url = self.shown.clone();
            let what = what.to_owned();
            move |source| AmqpError::Broker { url, what, source }
        };
        self.queue_exists(&super::channel(&connection, &self.shown).await?)
            .await?;
        let channel = super::channel(&connection, &self.shown).await?;
        channel
            .basic_qos(self.config.batch, BasicQosOptions::default())
            .await
            .map_err(broker("setting the prefetch"))?;
        let consumer = channel
            .basic_consume(
                self.config.queue.as_str().into(),
                self.config.name.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker(&format!("consuming queue `{}`", self.config.queue)))?;
        Ok(Link {
            connection,
            channel,
            consumer,
        })
    }

    /// A passive declaration of the queue on `channel` (which a missing queue closes).
    async fn queue_exists(&self, channel: &Channel) -> Result<(), AmqpError> {
        channel
            .queue_declare(
                self.config.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ())
            .map_err(|source| {
                if super::relay::not_found(&source) {
                    AmqpError::NoQueue {
                        url: self.shown.clone(),
                        queue: self.config.queue.clone(),
                    }
                } else {
                    AmqpError::Broker {
                        url: self.shown.clone(),
                        what: format!("checking queue `{}`", self.config.queue),
                        source,
                    }
                }
            })
    }

    /// Receives one batch (waiting up to [`InboxConfig::fetch_wait`] for its first message)
    /// and settles each message as the inbox core's verdict says: [`fetch_and_commit`]
    /// then [`Committed::settle`].
    ///
    /// # Errors
    /// As [`fetch_and_commit`]; [`AmqpError::Outbox`] when the commit failed (the batch was
    /// given back).
    ///
    /// # Cancel safety
    /// Cancel safe: a batch dropped before its acks comes back and is skipped as duplicates.
    ///
    /// [`fetch_and_commit`]: Self::fetch_and_commit
    pub async fn receive(&self) -> Result<InboxReport, AmqpError> {
        let mut committed = self.fetch_and_commit().await?;
        let error = committed.error.0.take();
        let report = committed.settle().await;
        match error {
            Some(e) => Err(AmqpError::Outbox(e)),
            None => Ok(report),
        }
    }

    /// Receives one batch (waiting up to [`InboxConfig::fetch_wait`] for its first message)
    /// and commits it through the inbox core, without settling it with the broker: call
    /// [`Committed::settle`] (a process that dies before has its messages redelivered, and
    /// the core skips them as duplicates).
    ///
    /// # Errors
    /// [`AmqpError::NoQueue`] when the queue was deleted (the broker cancelled the consumer);
    /// [`AmqpError::Connect`] and [`AmqpError::Broker`] when the connection or channel was
    /// lost (the next call reconnects; unacknowledged messages come back). A failed commit is
    /// not an error here: [`Committed::error`] says why, and settling gives the batch back.
    ///
    /// # Cancel safety
    /// Cancel safe: a batch dropped before its acks comes back and is skipped as duplicates.
    pub async fn fetch_and_commit(&self) -> Result<Committed, AmqpError> {
        let deliveries = self.fetch().await?;
        Ok(self.commit(deliveries).await)
    }

    /// Receives one batch (waiting up to [`InboxConfig::fetch_wait`] for its first message).
    async fn fetch(&self) -> Result<Vec<Delivery>, AmqpError> {
        let mut link = self.link.lock().await;
        if link
            .as_ref()
            .is_none_or(|l| !l.channel.status().connected() || !l.connection.status().connected())
        {
            *link = None;
            *link = Some(self.open().await?);
        }
        let Some(l) = link.as_mut() else {
            return Ok(Vec::new());
        };
        let mut deliveries: Vec<Delivery> = Vec::new();
        let mut wait = self.config.fetch_wait;
        while deliveries.len() < usize::from(self.config.batch) {
            match tokio::time::timeout(wait, l.consumer.next()).await {
                Err(_) => break,
                Ok(Some(Ok(d))) => deliveries.push(d),
                Ok(Some(Err(source))) => {
                    *link = None;
                    return Err(AmqpError::Broker {
                        url: self.shown.clone(),
                        what: format!("consuming queue `{}`", self.config.queue),
                        source,
                    });
                }
                Ok(None) => {
                    // The broker cancelled the consumer: the queue was deleted, or the
                    // channel closed. Never an idle end of stream.
                    let channel = l.connection.create_channel().await;
                    *link = None;
                    if let Ok(channel) = channel {
                        self.queue_exists(&channel).await?;
                    }
                    return Err(AmqpError::Broker {
                        url: self.shown.clone(),
                        what: format!(
                            "the consumer of queue `{}` was cancelled",
                            self.config.queue
                        ),
                        source: lapin::ErrorKind::FutureCompleted.into(),
                    });
                }
            }
            wait = self.config.batch_wait;
        }
        if let Some(counter) = &self.fetched {
            counter.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
        }
        Ok(deliveries)
    }

    /// Commits `deliveries` through the inbox core.
    async fn commit(&self, deliveries: Vec<Delivery>) -> Committed {
        if deliveries.is_empty() {
            return Committed::empty();
        }
        let batch: Vec<Incoming> = deliveries.iter().map(|d| self.incoming(d)).collect();
        let receipt = self.outbox.receive(&self.config.name, batch).await;
        Committed {
            deliveries,
            verdicts: receipt.verdicts,
            report: receipt.report,
            error: CommitError(receipt.error),
        }
    }

    /// One batch as [`run`](Self::run) takes it: fetched, committed, and — when the commit
    /// fails — held unacknowledged and committed again every second for up to
    /// [`InboxConfig::hold_failed_batch`], then settled.
    async fn receive_holding(&self, cancel: &CancellationToken) -> Result<InboxReport, AmqpError> {
        let mut committed = self.fetch_and_commit().await?;
        let held_since = Instant::now();
        let mut warned = false;
        while committed.error.0.is_some()
            && !cancel.is_cancelled()
            && held_since.elapsed() < self.config.hold_failed_batch
        {
            if let (false, Some(e)) = (warned, committed.error.0.as_ref()) {
                warned = true;
                tracing::warn!(inbox = %self.config.name, messages = committed.deliveries.len(), error = %event_core::ErrorChain(e), "inbox could not commit a batch: holding its messages unacknowledged (the broker neither redelivers nor counts them) and committing again every second");
            }
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            committed = self.commit(committed.deliveries).await;
        }
        if warned && committed.error.0.is_none() {
            tracing::warn!(inbox = %self.config.name, "inbox committed the held batch after {:.1} s", held_since.elapsed().as_secs_f64());
        }
        let error = committed.error.0.take();
        let report = committed.settle().await;
        match error {
            Some(e) => Err(AmqpError::Outbox(e)),
            None => Ok(report),
        }
    }

    /// How many messages the parking queue holds, reported as a gauge and, while any, a
    /// warning.
    async fn watch_parking(&self) {
        let Some(parking) = &self.config.parking_queue else {
            return;
        };
        let count = match super::connect(&self.url).await {
            Ok(connection) => match super::channel(&connection, &self.shown).await {
                Ok(channel) => super::queues::message_count(&channel, &self.shown, parking).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match count {
            Ok(n) => {
                metrics::gauge!("events_rabbitmq_parked_messages", "queue" => parking.clone())
                    .set(f64::from(n));
                if n > 0 {
                    tracing::warn!(inbox = %self.config.name, parking_queue = %parking, parked = n, "the broker parked messages it gave up on after the delivery limit: no inbox receives them until they are moved back (the management UI's shovel or rabbitmqadmin)");
                }
            }
            Err(e) => {
                tracing::debug!(inbox = %self.config.name, error = %event_core::ErrorChain(&e), "could not read the parking queue's depth");
            }
        }
    }

    /// Whether the queue still exists and the broker answers (what an idle inbox checks
    /// before it concludes that nothing more is coming).
    ///
    /// # Errors
    /// [`AmqpError::NoQueue`]; [`AmqpError::Connect`] / [`AmqpError::Broker`] when the broker
    /// cannot be asked.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn verify(&self) -> Result<(), AmqpError> {
        let connection = super::connect(&self.url).await?;
        self.queue_exists(&super::channel(&connection, &self.shown).await?)
            .await
    }

    /// A delivery as the inbox core takes it.
    fn incoming(&self, d: &Delivery) -> Incoming {
        let header = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned());
        let previous = header.as_ref().and_then(|v| match v {
            AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
            AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
            AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(u64::from(*n)),
            _ => None,
        });
        let count = match previous {
            Some(n) => n + 1,
            None if d.redelivered => 2,
            None => 1,
        };
        let mut origin = Origin::new("rabbitmq", self.config.queue.as_str(), 0)
            .delivery_count(count)
            .attribute("exchange", d.exchange.as_str())
            .attribute("routing_key", d.routing_key.as_str())
            .attribute("queue", self.config.queue.as_str());
        if let Some(n) = previous {
            origin = origin.attribute("x-delivery-count", n.to_string());
        }
        let mut incoming = Incoming::new(d.data.clone(), origin);
        if let Some(ct) = d.properties.content_type() {
            incoming = incoming.content_type(ct.as_str());
        }
        if let Some(id) = d.properties.message_id() {
            incoming = incoming.message_id(id.as_str());
        }
        incoming
    }

    /// Receives batches until `cancel` fires or, with `idle`, until no message has arrived for
    /// that long while the broker and the database answer (an outage is never mistaken for
    /// an empty queue). A batch whose commit fails is held unacknowledged and committed again
    /// every second (see [`InboxConfig::hold_failed_batch`]); a lost connection is retried
    /// every second; the first failure of an outage is logged (warn). With
    /// [`InboxConfig::parking_queue`] set, the parking queue's depth is read every minute.
    ///
    /// # Errors
    /// [`AmqpError::NoQueue`]: the queue was deleted; events published meanwhile went
    /// nowhere. Nothing else stops the loop.
    ///
    /// # Cancel safety
    /// As [`receive`](Self::receive); prefer `cancel`, which lets the batch in hand be acked.
    pub async fn run(
        &self,
        cancel: CancellationToken,
        idle: Option<Duration>,
    ) -> Result<InboxReport, AmqpError> {
        let mut total = InboxReport::default();
        let mut last = Instant::now();
        let mut failing: Option<Instant> = None;
        let mut parking_read: Option<Instant> = None;
        while !cancel.is_cancelled() {
            if parking_read.is_none_or(|at| at.elapsed() >= PARKING_EVERY) {
                parking_read = Some(Instant::now());
                self.watch_parking().await;
            }
            match self.receive_holding(&cancel).await {
                Ok(r) => {
                    if r.received > 0 {
                        last = Instant::now();
                    }
                    total += r;
                    if let Some(since) = failing.take() {
                        tracing::warn!(inbox = %self.config.name, "inbox receiving again after {:.1} s", since.elapsed().as_secs_f64());
                    }
                }
                Err(e @ AmqpError::NoQueue { .. }) => {
                    tracing::error!(inbox = %self.config.name, error = %event_core::ErrorChain(&e), "inbox stopped");
                    return Err(e);
                }
                Err(e) => {
                    if failing.is_none() {
                        tracing::warn!(inbox = %self.config.name, error = %event_core::ErrorChain(&e), "inbox batch failed; retrying every second");
                        failing = Some(Instant::now());
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
            // Idle means the queue has nothing, not that the broker or the database is away.
            if failing.is_none() && idle.is_some_and(|idle| last.elapsed() >= idle) {
                break;
            }
        }
        Ok(total)
    }
}

/// How often [`AmqpInbox::run`] reads the parking queue's depth.
const PARKING_EVERY: Duration = Duration::from_secs(60);

/// The checks of an inbox's configuration against its consuming outbox that need no broker.
#[allow(clippy::result_large_err)] // As `AmqpGroup::new`: checked once at start.
pub(super) fn preflight(outbox: &Outbox, config: &InboxConfig) -> Result<(), AmqpError> {
    if !config.allow_in_transaction_handlers {
        if let Some(refusal) = crate::inbox::in_transaction_refusal(outbox) {
            return Err(AmqpError::Config(refusal));
        }
    }
    let retention = outbox.config().retention;
    let bound = config.redelivery_bound();
    if retention <= bound {
        return Err(AmqpError::RetentionTooShort { retention, bound });
    }
    Ok(())
}

/// Why a batch was not committed, if it was not.
#[derive(Debug)]
struct CommitError(Option<crate::OutboxError>);

/// A batch the inbox core has committed (or could not), its messages not yet settled with the
/// broker: [`settle`](Self::settle) acknowledges what the core settled and gives back the
/// rest.
#[derive(Debug)]
#[must_use = "settle the batch, or its messages come back when the connection closes"]
pub struct Committed {
    deliveries: Vec<Delivery>,
    verdicts: Vec<Verdict>,
    report: InboxReport,
    error: CommitError,
}

impl Committed {
    fn empty() -> Self {
        Committed {
            deliveries: Vec::new(),
            verdicts: Vec::new(),
            report: InboxReport::default(),
            error: CommitError(None),
        }
    }

    /// What the core did (no acks counted yet).
    pub fn report(&self) -> InboxReport {
        self.report
    }

    /// Why the batch was not committed, if it was not: its messages are given back by
    /// [`settle`](Self::settle).
    pub fn error(&self) -> Option<&crate::OutboxError> {
        self.error.0.as_ref()
    }

    /// Acknowledges each message the core settled (accepted, duplicate, dead-lettered) and
    /// gives back the others (nack, requeue). Returns the report with the acks counted; an
    /// ack that could not be sent (a lost channel) is counted in `ack_failed`: the message
    /// comes back and is skipped as a duplicate.
    ///
    /// # Cancel safety
    /// Cancel safe: what was not acknowledged comes back.
    pub async fn settle(self) -> InboxReport {
        let mut report = self.report;
        for (d, verdict) in self.deliveries.iter().zip(&self.verdicts) {
            let settled = match verdict {
                Verdict::Retry => d
                    .acker
                    .nack(BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    })
                    .await
                    .map(|_| false),
                _ => d.acker.ack(BasicAckOptions::default()).await.map(|_| true),
            };
            match settled {
                Ok(true) => report.acked += 1,
                Ok(false) => {}
                Err(_) => report.ack_failed += 1,
            }
        }
        report
    }
}
