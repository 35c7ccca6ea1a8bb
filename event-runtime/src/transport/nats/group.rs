//! A group of inbox instances sharing the partitions of a stream: each instance renews a lease
//! in the consuming database, computes the same assignment of partitions over the live
//! instances ([`assign`](super::assign)), consumes the partitions assigned to it — each through
//! a durable pull consumer of its own, filtered on the partition's subjects — and hands over
//! the others. Correctness never depends on it (the inbox core's chains keep each aggregate's
//! order, its de-duplication makes each event's effects once, whoever commits it): it bounds
//! what a dead instance delays to its share, and lets consumption grow with instances.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;

use crate::inbox::group::Consume;
pub use crate::inbox::GroupConfig;

use super::inbox::preflight;
use super::{InboxConfig, InboxReport, NatsError, NatsInbox, StreamShape};
use crate::{GroupView, Outbox};

/// The durable consumer of partition `partition` of an inbox named `durable`:
/// `<durable>-<partition>` (its dead letters' handler: `nats-inbox:<durable>-<partition>`).
pub fn partition_durable(durable: &str, partition: u32) -> String {
    format!("{durable}-{partition}")
}

/// One instance of a group of inboxes over a partitioned stream: see the
/// [module docs](super#a-group-of-instances).
#[derive(Debug)]
pub struct NatsGroup {
    js: jetstream::Context,
    outbox: Outbox,
    inbox: InboxConfig,
    group: String,
    member: String,
    lease: Duration,
    /// Set once the consumer from before the partitions was deleted: nothing more to drain.
    unpartitioned_gone: Arc<AtomicBool>,
}

impl NatsGroup {
    /// An instance of the group consuming `inbox` (its stream, durable name — each partition's
    /// consumer is [`partition_durable`] of it —, filter, batch and acks; its
    /// [`partitions`](InboxConfig::partitions) the stream's, its
    /// [`partition`](InboxConfig::partition) unset) into `outbox`.
    ///
    /// # Errors
    /// [`NatsError::Config`] for an invalid configuration (as [`NatsInbox::new`], a lease
    /// under 1 s or a member name that is empty, a partition set);
    /// [`NatsError::RetentionTooShort`].
    pub fn new(
        js: &jetstream::Context,
        outbox: Outbox,
        inbox: InboxConfig,
        config: GroupConfig,
    ) -> Result<NatsGroup, NatsError> {
        preflight(&outbox, &inbox)?;
        if inbox.partition.is_some() {
            return Err(NatsError::Config(
                "a group assigns partitions itself: leave InboxConfig::partition unset".into(),
            ));
        }
        if config.lease < Duration::from_secs(1) {
            return Err(NatsError::Config(format!(
                "the group's lease must be 1 s or longer, not {:?}",
                config.lease
            )));
        }
        if config.member.trim().is_empty() {
            return Err(NatsError::Config("the member name is empty".into()));
        }
        Ok(NatsGroup {
            js: js.clone(),
            group: config.group.unwrap_or_else(|| inbox.durable.clone()),
            member: config.member,
            lease: config.lease,
            outbox,
            inbox,
            unpartitioned_gone: Arc::new(AtomicBool::new(false)),
        })
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
    /// [`NatsError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn view(&self) -> Result<GroupView, NatsError> {
        Ok(self.outbox.store().group_view(&self.group).await?)
    }

    /// Takes part in the group until `cancel` fires or, with `idle`, until none of its
    /// partitions received a message for that long (a partition taken or given up restarts
    /// that time): joins it, and every quarter of the lease
    /// renews its lease, computes the assignment over the live instances, starts consuming
    /// each partition assigned to it once the previous holder released it (or its hold
    /// expired), and stops consuming — after the batch in hand is committed and
    /// acknowledged — and releases each partition no longer assigned to it. On its way out it
    /// stops every partition the same way, releases them and leaves, so that the others take
    /// them at once. Returns what its partitions received.
    ///
    /// While it cannot reach its database it consumes on until its lease would have expired,
    /// then stops every partition (another instance may hold them by then), and takes them
    /// again once it can. A partition's inbox that cannot reach the broker retries every
    /// second, as [`NatsInbox::run`].
    ///
    /// # Errors
    /// [`NatsError::PartitionsMismatch`] when the stream has another count of partitions than
    /// the inbox's configuration; [`NatsError::NoStream`]; [`NatsError::Broker`] when the
    /// stream cannot be read at start; a verdict of one partition's inbox
    /// ([`NatsError::is_fatal`]: its broker identity changed, or messages were lost) or a
    /// configuration it refuses, after the other partitions stopped.
    ///
    /// # Cancel safety
    /// Cancel safe as [`NatsInbox::run`] (dropped, its partitions lapse after the lease and
    /// their unacknowledged messages are redelivered); prefer `cancel`, which hands them over
    /// at once.
    pub async fn run(
        &self,
        cancel: CancellationToken,
        idle: Option<Duration>,
    ) -> Result<InboxReport, NatsError> {
        let shape = StreamShape::fetch(&self.js, &self.inbox.stream).await?;
        if shape.partitions != self.inbox.partitions {
            return Err(NatsError::PartitionsMismatch {
                stream: shape.name,
                what: format!("inbox group `{}`", self.group),
                configured: self.inbox.partitions,
                found: shape.partitions,
            });
        }
        // The inbox's consumer from before the partitions (the durable name itself): while it
        // exists, the holder of partition 0 drains it too.
        let unpartitioned = self.inbox.partitions > 1
            && super::inbox::observe(&self.js, &self.inbox.stream, &self.inbox.durable)
                .await?
                .consumer
                .is_some();
        if unpartitioned {
            tracing::info!(group = %self.group, durable = %self.inbox.durable, "inbox group: the consumer from before the stream's partitions exists: the holder of partition 0 consumes it too (delete it once it has nothing pending)");
        }
        let fetched = Arc::new(AtomicU64::new(0));
        let group = crate::inbox::group::Group {
            outbox: &self.outbox,
            group: &self.group,
            member: &self.member,
            lease: self.lease,
            partitions: self.inbox.partitions,
            gauge: metrics::gauge!("events_nats_group_partitions_held", "group" => self.group.clone()),
        };
        let start = |p: u32, stop: CancellationToken| -> Consume<NatsError> {
            let config = InboxConfig {
                durable: partition_durable(&self.inbox.durable, p),
                ..self.inbox.clone().partition(p)
            };
            let (js, outbox, counter) =
                (self.js.clone(), self.outbox.clone(), Arc::clone(&fetched));
            let partition = consume(js, outbox, config, stop.clone(), counter);
            if p != 0 || !unpartitioned || self.unpartitioned_gone.load(Ordering::Relaxed) {
                return Box::pin(partition);
            }
            // The holder of partition 0 drains the consumer from before the partitions too,
            // until it is deleted; either one's verdict stops both.
            let mut legacy = self.inbox.clone();
            legacy.unpartitioned = true;
            let drain = drain_unpartitioned(
                self.js.clone(),
                self.outbox.clone(),
                legacy,
                stop.clone(),
                Arc::clone(&fetched),
                Arc::clone(&self.unpartitioned_gone),
            );
            Box::pin(async move {
                let stop_both = |r: &Result<InboxReport, NatsError>| {
                    if r.is_err() {
                        stop.cancel();
                    }
                };
                let (a, b) = tokio::join!(
                    async {
                        let r = partition.await;
                        stop_both(&r);
                        r
                    },
                    async {
                        let r = drain.await;
                        stop_both(&r);
                        r
                    }
                );
                let mut total = a?;
                total += b?;
                Ok(total)
            })
        };
        group.run(cancel, idle, Arc::clone(&fetched), start).await
    }
}

/// Consumes the inbox's consumer from before the partitions until `stop`, or until it is
/// deleted (the procedure's last step: done, not lost).
async fn drain_unpartitioned(
    js: jetstream::Context,
    outbox: Outbox,
    config: InboxConfig,
    stop: CancellationToken,
    fetched: Arc<AtomicU64>,
    gone: Arc<AtomicBool>,
) -> Result<InboxReport, NatsError> {
    let (stream, durable) = (config.stream.clone(), config.durable.clone());
    match consume(js.clone(), outbox, config, stop, fetched).await {
        Err(NatsError::IdentityChanged { .. })
            if super::inbox::observe(&js, &stream, &durable)
                .await
                .is_ok_and(|o| o.consumer.is_none()) =>
        {
            tracing::info!(durable = %durable, "inbox group: the consumer from before the partitions was deleted: nothing more to drain");
            gone.store(true, Ordering::Relaxed);
            Ok(InboxReport::default())
        }
        other => other,
    }
}

/// Whether waiting will not make `e` go away: the group stops on it.
fn permanent(e: &NatsError) -> bool {
    e.is_fatal()
        || matches!(
            e,
            NatsError::Config(_)
                | NatsError::RetentionTooShort { .. }
                | NatsError::PartitionsMismatch { .. }
        )
}

/// Consumes one partition until `stop`: binds its inbox (retrying every second while the
/// broker or the database cannot be had), then runs it.
async fn consume(
    js: jetstream::Context,
    outbox: Outbox,
    config: InboxConfig,
    stop: CancellationToken,
    fetched: Arc<AtomicU64>,
) -> Result<InboxReport, NatsError> {
    let open = || NatsInbox::new(&js, outbox.clone(), config.clone());
    match crate::inbox::group::open_retrying(&config.durable, &stop, open, permanent).await? {
        Some(inbox) => inbox.count_fetched(fetched).run(stop, None).await,
        None => Ok(InboxReport::default()),
    }
}
