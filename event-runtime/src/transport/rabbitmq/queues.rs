//! The broker's side, declared on purpose: the exchange a relay publishes to, a consuming
//! service's partition queues bound to it, and where the broker parks what it gave up on.
//! Never declared implicitly by the relay or the inbox (a typo would create an empty queue
//! nobody publishes to); `events rabbitmq topology create|check` runs it.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ExchangeKind};

use super::{redact_url, AmqpError};

/// The exchange and a consuming service's queues: [`BrokerTopology::new`], changed with one
/// setter per field.
///
/// - the exchange: a durable topic exchange;
/// - the consumer's queues: one per partition, `<consumer>.<k>` (`<consumer>` itself with one
///   partition), each a quorum queue (replicated on a cluster, `x-queue-type: quorum`) with a
///   delivery limit (`x-delivery-limit`), a dead-letter exchange `<consumer>.dlx` and a
///   single active consumer (`x-single-active-consumer`: a guard — a second consumer of a
///   queue waits; instances share the queues through [`AmqpGroup`](super::AmqpGroup)'s
///   leases; such a queue refuses `basic.get`: read it with a consumer), bound to the
///   exchange with each binding pattern inside its partition (`events.3.order.#`);
/// - the parking queue `<consumer>.parking`, a quorum queue bound to `<consumer>.dlx` (a
///   fanout exchange): where the broker moves a message delivered more often than the limit
///   without an acknowledgement. The inbox acknowledges everything it settled (dead letters
///   included), so only a message whose batch never commits ends there.
///
/// # Redelivery bound
/// A message comes back at most [`delivery_limit`](Self::delivery_limit) times (it is
/// delivered up to limit + 1 times: the quorum queue parks it when its count of returns
/// exceeds the limit), each after at
/// most the broker's consumer timeout (RabbitMQ's `consumer_timeout`, 30 min by default; a
/// consumer that holds a delivery longer loses its channel and the message is requeued):
/// [`redelivery_bound`](Self::redelivery_bound) is (limit + 1) × that timeout, which the consuming outbox's
/// [`retention`](crate::OutboxConfig::retention) (its de-duplication window) must exceed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BrokerTopology {
    /// The exchange (the relay's [`RelayConfig::exchange`](super::RelayConfig::exchange)).
    pub exchange: String,
    /// The consuming service's name: its queues' prefix.
    pub consumer: String,
    /// The partitions (the relay's [`RelayConfig::partitions`](super::RelayConfig::partitions)).
    pub partitions: u32,
    /// The routing keys' first token (the relay's prefix, default `events`).
    pub routing_key_prefix: String,
    /// What each queue takes, as topic patterns after the prefix (default `["#"]`: every
    /// event; `["order.#"]`: the `order.*` events). A consumer must take every routing key of
    /// the aggregate types it consumes: each event names its predecessor, whatever its name.
    pub bindings: Vec<String>,
    /// Redeliveries of one message at most before the broker parks it (default 20; RabbitMQ's
    /// `x-delivery-limit` counts returns, so a message is delivered up to limit + 1 times).
    pub delivery_limit: u32,
}

impl BrokerTopology {
    /// The exchange `exchange` and the queues of the consuming service `consumer`, with the
    /// defaults above.
    pub fn new(exchange: impl Into<String>, consumer: impl Into<String>) -> Self {
        BrokerTopology {
            exchange: exchange.into(),
            consumer: consumer.into(),
            partitions: 1,
            routing_key_prefix: "events".into(),
            bindings: vec!["#".into()],
            delivery_limit: 20,
        }
    }

    /// With [`partitions`](Self::partitions) set.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions.clamp(1, crate::transport::MAX_PARTITIONS);
        self
    }

    /// With [`routing_key_prefix`](Self::routing_key_prefix) set.
    pub fn routing_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.routing_key_prefix = prefix.into();
        self
    }

    /// With [`bindings`](Self::bindings) set.
    pub fn bindings(mut self, patterns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.bindings = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// With [`delivery_limit`](Self::delivery_limit) set (at least 1).
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit.max(1);
        self
    }

    /// The queue of `partition`: `<consumer>.<partition>`, or `<consumer>` with one partition.
    pub fn queue(&self, partition: u32) -> String {
        if self.partitions > 1 {
            format!("{}.{partition}", self.consumer)
        } else {
            self.consumer.clone()
        }
    }

    /// The queue of every partition, in order.
    pub fn queues(&self) -> Vec<String> {
        (0..self.partitions).map(|p| self.queue(p)).collect()
    }

    /// `<consumer>.parking`.
    pub fn parking_queue(&self) -> String {
        format!("{}.parking", self.consumer)
    }

    /// `<consumer>.dlx`.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.consumer)
    }

    /// The binding keys of `partition`'s queue: each pattern after the prefix and, when
    /// partitioned, the partition token after the key's first token, as the relay places it
    /// ([`RelayConfig::routing_key_of`](super::RelayConfig::routing_key_of)):
    /// `events.3.order.#`; with the prefix `acme.events`, `acme.3.events.order.#`.
    pub fn binding_keys(&self, partition: u32) -> Vec<String> {
        self.bindings
            .iter()
            .map(|pattern| {
                let key = format!("{}.{pattern}", self.routing_key_prefix);
                if self.partitions > 1 {
                    crate::transport::partition::partitioned_subject(&key, partition)
                } else {
                    key
                }
            })
            .collect()
    }

    /// The binding keys of every queue as an operator reads them: `events.order.#`, or with
    /// partitions `events.<k>.order.#` (queue `<consumer>.<k>` takes partition k).
    pub fn binding_keys_shown(&self) -> Vec<String> {
        self.bindings
            .iter()
            .map(|pattern| {
                let key = format!("{}.{pattern}", self.routing_key_prefix);
                if self.partitions > 1 {
                    crate::transport::partition::partitioned_subject(&key, "<k>")
                } else {
                    key
                }
            })
            .collect()
    }

    /// The inbox of `partition`'s queue: [`InboxConfig::new`](super::InboxConfig::new) of
    /// [`queue`](Self::queue)`(partition)`, watching this topology's parking queue
    /// ([`InboxConfig::parking_queue`](super::InboxConfig::parking_queue)).
    pub fn inbox_config(&self, partition: u32) -> super::InboxConfig {
        super::InboxConfig::new(self.queue(partition)).parking_queue(self.parking_queue())
    }

    /// The messages ready in each partition's queue (not counting those delivered and not yet
    /// acknowledged), in partition order.
    ///
    /// # Errors
    /// [`AmqpError::Connect`]; [`AmqpError::NoQueue`] for a queue that does not exist.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn ready(&self, url: &str) -> Result<Vec<(String, u32)>, AmqpError> {
        let connection = super::connect(url).await?;
        let shown = redact_url(url);
        let mut out = Vec::with_capacity(self.partitions as usize);
        for queue in self.queues() {
            // A channel per queue: a missing one closes the channel it was asked on.
            let channel = fresh(&connection, &shown).await?;
            let n = message_count(&channel, &shown, &queue).await?;
            out.push((queue, n));
        }
        Ok(out)
    }

    /// How many messages the parking queue holds: each one the broker gave up on after the
    /// delivery limit, which no inbox will receive (move them back with the management UI's
    /// shovel, or `rabbitmqadmin`, once the cause is fixed).
    ///
    /// # Errors
    /// [`AmqpError::Connect`]; [`AmqpError::NoQueue`] when the parking queue does not exist.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn parked(&self, url: &str) -> Result<u32, AmqpError> {
        let (_connection, channel) = connect(url).await?;
        message_count(&channel, &redact_url(url), &self.parking_queue()).await
    }

    /// ([`delivery_limit`](Self::delivery_limit) + 1) × `consumer_timeout` (the broker's; 30
    /// min by default): how long a message can keep coming back.
    pub fn redelivery_bound(&self, consumer_timeout: Duration) -> Duration {
        consumer_timeout * (self.delivery_limit + 1)
    }

    /// The arguments of a partition queue.
    fn queue_arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        arguments.insert("x-queue-type".into(), long_string("quorum"));
        arguments.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(self.delivery_limit)),
        );
        arguments.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.dead_letter_exchange()),
        );
        // A guard, not the way instances share partitions (the inbox group's leases are): a
        // second consumer of a queue waits until the first is gone.
        arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        arguments
    }

    /// The arguments of the parking queue.
    fn parking_arguments() -> FieldTable {
        let mut arguments = FieldTable::default();
        arguments.insert("x-queue-type".into(), long_string("quorum"));
        arguments
    }

    /// Declares the exchange, the dead-letter exchange, the parking queue and each partition's
    /// queue with its bindings. Declaring what exists with the same settings changes nothing,
    /// so running it again is safe; what exists with other settings is refused by the broker
    /// (as [`check`](Self::check) reports it), and nothing is changed. A consumer whose
    /// queues exist with another partition count is refused before anything is declared.
    ///
    /// # Errors
    /// [`AmqpError::Connect`]; [`AmqpError::PartitionsMismatch`];
    /// [`AmqpError::Mismatch`] naming the exchange or queue and the setting the broker holds
    /// otherwise; [`AmqpError::Broker`] for another refusal.
    ///
    /// # Cancel safety
    /// Not atomic: dropped part-way, what was declared stays; run it again.
    pub async fn create(&self, url: &str) -> Result<(), AmqpError> {
        let (connection, channel) = connect(url).await?;
        let shown = redact_url(url);
        if let Some(found) = self.partitions_found(&connection, &shown).await? {
            if let Some(e) = self.partitions_differ(&shown, found) {
                return Err(e);
            }
        }
        let refused = |what: String| {
            let url = shown.clone();
            move |source: lapin::Error| mismatch_or_broker(&url, what, source)
        };
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .map_err(refused(format!("exchange `{}`", self.exchange)))?;
        let dlx = self.dead_letter_exchange();
        channel
            .exchange_declare(
                dlx.as_str().into(),
                ExchangeKind::Fanout,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .map_err(refused(format!("exchange `{dlx}`")))?;
        let parking = self.parking_queue();
        channel
            .queue_declare(
                parking.as_str().into(),
                durable_queue(false),
                Self::parking_arguments(),
            )
            .await
            .map_err(refused(format!("queue `{parking}`")))?;
        channel
            .queue_bind(
                parking.as_str().into(),
                dlx.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(refused(format!("binding of `{parking}`")))?;
        for p in 0..self.partitions {
            let queue = self.queue(p);
            channel
                .queue_declare(
                    queue.as_str().into(),
                    durable_queue(false),
                    self.queue_arguments(),
                )
                .await
                .map_err(refused(format!("queue `{queue}`")))?;
            for key in self.binding_keys(p) {
                channel
                    .queue_bind(
                        queue.as_str().into(),
                        self.exchange.as_str().into(),
                        key.as_str().into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(refused(format!("binding `{key}` of `{queue}`")))?;
            }
        }
        Ok(())
    }

    /// Checks what exists against this topology, changing nothing: the exchanges exist (and are
    /// durable topic and fanout exchanges), the consumer has as many partition queues as the
    /// topology, and each queue exists with the arguments above —
    /// the broker refuses a declaration whose settings differ from the queue's, naming the
    /// setting (`inequivalent arg 'x-delivery-limit'`), and the refusal is reported. Bindings
    /// cannot be read over AMQP 0-9-1 (only through the management plugin): `create` asserts
    /// them.
    ///
    /// # Errors
    /// [`AmqpError::Connect`]; [`AmqpError::NoExchange`] or [`AmqpError::NoQueue`] for what is
    /// missing; [`AmqpError::PartitionsMismatch`]; [`AmqpError::Mismatch`] naming the exchange
    /// or queue and the setting.
    ///
    /// # Cancel safety
    /// Cancel safe: it declares nothing new.
    pub async fn check(&self, url: &str) -> Result<(), AmqpError> {
        let (connection, _) = connect(url).await?;
        let shown = redact_url(url);
        self.check_exchange(&connection, &shown, &self.exchange, ExchangeKind::Topic)
            .await?;
        match self.partitions_found(&connection, &shown).await? {
            Some(found) => {
                if let Some(e) = self.partitions_differ(&shown, found) {
                    return Err(e);
                }
            }
            None => {
                return Err(AmqpError::NoQueue {
                    url: shown,
                    queue: self.queue(0),
                })
            }
        }
        self.check_exchange(
            &connection,
            &shown,
            &self.dead_letter_exchange(),
            ExchangeKind::Fanout,
        )
        .await?;
        let mut queues: Vec<(String, FieldTable)> =
            vec![(self.parking_queue(), Self::parking_arguments())];
        queues.extend(
            self.queues()
                .into_iter()
                .map(|q| (q, self.queue_arguments())),
        );
        for (queue, arguments) in queues {
            if !exists(&connection, &shown, &queue).await? {
                return Err(AmqpError::NoQueue { url: shown, queue });
            }
            let channel = fresh(&connection, &shown).await?;
            channel
                .queue_declare(queue.as_str().into(), durable_queue(false), arguments)
                .await
                .map_err(|e| mismatch_or_broker(&shown, format!("queue `{queue}`"), e))?;
        }
        Ok(())
    }

    /// That `exchange` exists, of `kind` and durable.
    async fn check_exchange(
        &self,
        connection: &Connection,
        shown: &str,
        exchange: &str,
        kind: ExchangeKind,
    ) -> Result<(), AmqpError> {
        let channel = fresh(connection, shown).await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        if let Err(e) = channel
            .exchange_declare(
                exchange.into(),
                kind.clone(),
                passive,
                FieldTable::default(),
            )
            .await
        {
            return Err(missing_or_broker(shown, exchange, true, e));
        }
        // Exists: the same declaration is a no-op, another type or durability refused.
        let channel = fresh(connection, shown).await?;
        channel
            .exchange_declare(
                exchange.into(),
                kind,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| mismatch_or_broker(shown, format!("exchange `{exchange}`"), e))
    }

    /// How many partition queues the consumer has on the broker: `<consumer>.0` …
    /// `<consumer>.<k-1>` (k), else `<consumer>` alone (1), else none.
    async fn partitions_found(
        &self,
        connection: &Connection,
        shown: &str,
    ) -> Result<Option<u32>, AmqpError> {
        let mut k = 0;
        while k < crate::transport::MAX_PARTITIONS
            && exists(connection, shown, &format!("{}.{k}", self.consumer)).await?
        {
            k += 1;
        }
        if k > 0 {
            return Ok(Some(k));
        }
        Ok(exists(connection, shown, &self.consumer)
            .await?
            .then_some(1))
    }

    /// [`AmqpError::PartitionsMismatch`] unless `found` is this topology's count.
    fn partitions_differ(&self, shown: &str, found: u32) -> Option<AmqpError> {
        (found != self.partitions).then(|| AmqpError::PartitionsMismatch {
            url: shown.to_owned(),
            consumer: self.consumer.clone(),
            configured: self.partitions,
            found,
        })
    }
}

/// Whether `queue` exists (a passive declaration, on a channel of its own: a missing queue
/// closes the channel it was asked on).
async fn exists(connection: &Connection, shown: &str, queue: &str) -> Result<bool, AmqpError> {
    let channel = fresh(connection, shown).await?;
    match channel
        .queue_declare(queue.into(), durable_queue(true), FieldTable::default())
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if super::relay::not_found(&e) => Ok(false),
        Err(e) => Err(missing_or_broker(shown, queue, false, e)),
    }
}

/// The messages ready in `queue` (a passive declaration).
pub(super) async fn message_count(
    channel: &Channel,
    shown: &str,
    queue: &str,
) -> Result<u32, AmqpError> {
    channel
        .queue_declare(queue.into(), durable_queue(true), FieldTable::default())
        .await
        .map(|q| q.message_count())
        .map_err(|e| missing_or_broker(shown, queue, false, e))
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

fn durable_exchange() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    }
}

fn durable_queue(passive: bool) -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive,
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

async fn connect(url: &str) -> Result<(Connection, Channel), AmqpError> {
    let connection = super::connect(url).await?;
    let channel = fresh(&connection, &redact_url(url)).await?;
    Ok((connection, channel))
}

/// A new channel (a refused declaration closes the one it was made on).
async fn fresh(connection: &Connection, shown: &str) -> Result<Channel, AmqpError> {
    super::channel(connection, shown).await
}

/// A 406 PRECONDITION_FAILED (what exists differs: the broker's text names the setting) as
/// [`AmqpError::Mismatch`]; anything else as [`AmqpError::Broker`].
fn mismatch_or_broker(url: &str, what: String, source: lapin::Error) -> AmqpError {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    match source.kind() {
        lapin::ErrorKind::ProtocolError(p)
            if matches!(
                p.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
            ) =>
        {
            AmqpError::Mismatch {
                url: url.to_owned(),
                what,
                detail: p.get_message().to_string(),
            }
        }
        _ => AmqpError::Broker {
            url: url.to_owned(),
            what: format!("declaring {what}"),
            source,
        },
    }
}

/// A 404 as [`AmqpError::NoExchange`] / [`AmqpError::NoQueue`]; anything else as
/// [`AmqpError::Broker`].
fn missing_or_broker(url: &str, name: &str, exchange: bool, source: lapin::Error) -> AmqpError {
    if super::relay::not_found(&source) {
        if exchange {
            AmqpError::NoExchange {
                url: url.to_owned(),
                exchange: name.to_owned(),
            }
        } else {
            AmqpError::NoQueue {
                url: url.to_owned(),
                queue: name.to_owned(),
            }
        }
    } else {
        AmqpError::Broker {
            url: url.to_owned(),
            what: format!("checking `{name}`"),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_binding_keys() {
        let t = BrokerTopology::new("events", "billing");
        assert_eq!(t.queues(), ["billing"]);
        assert_eq!(t.binding_keys(0), ["events.#"]);
        let t = t.partitions(3).bindings(["order.#"]);
        assert_eq!(t.queues(), ["billing.0", "billing.1", "billing.2"]);
        assert_eq!(t.binding_keys(2), ["events.2.order.#"]);
        let acme = t.clone().routing_key_prefix("acme.events");
        assert_eq!(acme.binding_keys(2), ["acme.2.events.order.#"]);
        let relay = super::super::RelayConfig::new("x")
            .routing_key_prefix("acme.events")
            .partitions(3);
        let key = relay.routing_key_of("order.placed", "order", "A-1");
        let p = crate::transport::partition_of("order", "A-1", 3);
        assert_eq!(key, format!("acme.{p}.events.order.placed"));
        assert_eq!(t.parking_queue(), "billing.parking");
        assert_eq!(t.dead_letter_exchange(), "billing.dlx");
        assert_eq!(
            t.redelivery_bound(Duration::from_secs(1800)),
            Duration::from_secs(37_800)
        );
    }
}
