//! A group of inbox instances sharing a consuming service's partition queues: the inbox
//! core's partition leases ([`crate::inbox::GroupConfig`]) decide which instance consumes
//! which queue; each consumes only the queues it holds. The queues' single active consumer is
//! a guard behind it, not the mechanism: a second consumer of a queue would wait.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{AmqpError, AmqpInbox, BrokerTopology, InboxConfig};
use crate::inbox::group::Consume;
use crate::inbox::{GroupConfig, InboxReport};
use crate::{GroupView, Outbox};

/// One instance of a group of inboxes over a consuming service's partition queues
/// ([`BrokerTopology`]): each instance renews a lease in the consuming database, computes the
/// same assignment of partitions over the live instances
/// ([`assign`](crate::transport::assign)), and consumes — with an [`AmqpInbox`] each — the
/// queues assigned to it; a queue no longer assigned to it is handed over after the batch in
/// hand is committed and acknowledged. An instance killed without a word lets its queues go
/// after the lease, and the broker gives its unacknowledged messages back at once (the
/// connection closed); the inbox core skips what was committed already.
///
/// ```no_run
/// use event_runtime::inbox::GroupConfig;
/// use event_runtime::transport::rabbitmq::{AmqpGroup, BrokerTopology};
/// use event_runtime::{CancellationToken, Outbox, Store};
///
/// # #[allow(dead_code)]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// // The producer's relay publishes with `RelayConfig::new("events").partitions(8)`.
/// let topology = BrokerTopology::new("events", "billing").partitions(8);
/// topology.create(url).await?; // or `events rabbitmq topology create billing --partitions 8`
/// let outbox = Outbox::builder(Store::connect("sqlite://billing.db").await?).build()?;
/// let _workers = outbox.spawn_workers(2);
/// // Every queue's inbox: batches of 256 (the queue and name are each partition's own).
/// let settings = topology.inbox_config(0).batch(256);
/// let group = AmqpGroup::new(url, outbox, topology, settings, GroupConfig::new())?;
/// let cancel = CancellationToken::new(); // cancel it on SIGTERM: the queues are handed over
/// let report = group.run(cancel, None).await?;
/// # let _ = report;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct AmqpGroup {
    url: String,
    outbox: Outbox,
    topology: BrokerTopology,
    inbox: InboxConfig,
    group: String,
    member: String,
    lease: Duration,
}

impl AmqpGroup {
    /// An instance of the group consuming `topology`'s partition queues on `url` into
    /// `outbox`. Each partition's inbox takes its settings from `inbox` (batch, waits, held
    /// batches, consumer timeout, in-transaction handlers: build it from
    /// [`topology.inbox_config(0)`](BrokerTopology::inbox_config)) with the queue, name
    /// (`rabbitmq-inbox:<queue>`), parking queue and delivery limit of its partition in
    /// `topology`: `inbox`'s own queue and name are not used. The group's name defaults to
    /// `topology.consumer`.
    ///
    /// # Errors
    /// [`AmqpError::Config`] for a lease under 1 s, an empty member name or an
    /// in-transaction handler; [`AmqpError::RetentionTooShort`].
    // The error type of every RabbitMQ operation, lapin's error inside: not worth boxing for
    // a constructor called once.
    #[allow(clippy::result_large_err)]
    pub fn new(
        url: impl Into<String>,
        outbox: Outbox,
        topology: BrokerTopology,
        inbox: InboxConfig,
        config: GroupConfig,
    ) -> Result<AmqpGroup, AmqpError> {
        if config.lease < Duration::from_secs(1) {
            return Err(AmqpError::Config(format!(
                "the group's lease must be 1 s or longer, not {:?}",
                config.lease
            )));
        }
        if config.member.trim().is_empty() {
            return Err(AmqpError::Config("the member name is empty".into()));
        }
        let group = AmqpGroup {
            url: url.into(),
            group: config.group.unwrap_or_else(|| topology.consumer.clone()),
            member: config.member,
            lease: config.lease,
            outbox,
            inbox,
            topology,
        };
        super::inbox::preflight(&group.outbox, &group.partition_config(0))?;
        Ok(group)
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This instance's name in the group.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The group as the database has it now.
    ///
    /// # Errors
    /// [`AmqpError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn view(&self) -> Result<GroupView, AmqpError> {
        self.outbox
            .store()
            .group_view(&self.group)
            .await
            .map_err(|e| AmqpError::Store(Box::new(e)))
    }

    /// The inbox settings of `partition`'s queue.
    fn partition_config(&self, partition: u32) -> InboxConfig {
        let queue = self.topology.queue(partition);
        InboxConfig {
            name: format!("rabbitmq-inbox:{queue}"),
            queue,
            parking_queue: Some(self.topology.parking_queue()),
            delivery_limit: self.topology.delivery_limit,
            ..self.inbox.clone()
        }
    }

    /// Takes part in the group until `cancel` fires or, with `idle`, until none of its queues
    /// received a message for that long while its database answers: checks the topology
    /// first ([`BrokerTopology::check`]: a start-up that refuses what does not match, naming
    /// it), then joins and every quarter of the lease renews its lease, consumes the queues
    /// assigned to it and hands over the others (as
    /// [`NatsGroup::run`](crate::transport::nats::NatsGroup::run) does on NATS). A queue's
    /// inbox that cannot reach the broker retries every second. Returns what its queues
    /// received.
    ///
    /// # Errors
    /// What [`BrokerTopology::check`] finds ([`AmqpError::NoQueue`], [`AmqpError::Mismatch`],
    /// [`AmqpError::Connect`]); a queue deleted while it runs ([`AmqpError::NoQueue`]) or a
    /// configuration an inbox refuses, after the other queues stopped.
    ///
    /// # Cancel safety
    /// Dropped, its queues lapse after the lease and the broker gives their unacknowledged
    /// messages back when the connections close; prefer `cancel`, which hands them over at
    /// once.
    pub async fn run(
        &self,
        cancel: CancellationToken,
        idle: Option<Duration>,
    ) -> Result<InboxReport, AmqpError> {
        self.topology.check(&self.url).await?;
        let fetched = Arc::new(AtomicU64::new(0));
        let group = crate::inbox::group::Group {
            outbox: &self.outbox,
            group: &self.group,
            member: &self.member,
            lease: self.lease,
            partitions: self.topology.partitions,
            gauge: metrics::gauge!("events_rabbitmq_group_partitions_held", "group" => self.group.clone()),
        };
        let start = |p: u32, stop: CancellationToken| -> Consume<AmqpError> {
            Box::pin(consume(
                self.url.clone(),
                self.outbox.clone(),
                self.partition_config(p),
                stop,
                Arc::clone(&fetched),
            ))
        };
        group.run(cancel, idle, Arc::clone(&fetched), start).await
    }
}

/// Whether waiting will not make `e` go away: the group stops on it.
fn permanent(e: &AmqpError) -> bool {
    matches!(
        e,
        AmqpError::Config(_) | AmqpError::RetentionTooShort { .. } | AmqpError::NoQueue { .. }
    )
}

/// Consumes one queue until `stop`: opens its inbox (retrying every second while the broker
/// cannot be had), then runs it.
async fn consume(
    url: String,
    outbox: Outbox,
    config: InboxConfig,
    stop: CancellationToken,
    fetched: Arc<AtomicU64>,
) -> Result<InboxReport, AmqpError> {
    let open = || AmqpInbox::new(&url, outbox.clone(), config.clone());
    match crate::inbox::group::open_retrying(&config.queue, &stop, open, permanent).await? {
        Some(inbox) => inbox.count_fetched(fetched).run(stop, None).await,
        None => Ok(InboxReport::default()),
    }
}
