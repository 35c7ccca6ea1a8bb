//! A group of inbox instances sharing the partitions of a stream: each instance renews a lease
//! in the consuming database, computes the same assignment of partitions over the live
//! instances ([`assign`](super::assign)), consumes the partitions assigned to it — each through
//! a durable pull consumer of its own, filtered on the partition's subjects — and hands over
//! the others. Correctness never depends on it (the inbox core's chains keep each aggregate's
//! order, its de-duplication makes each event's effects once, whoever commits it): it bounds
//! what a dead instance delays to its share, and lets consumption grow with instances.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::inbox::preflight;
use super::{InboxConfig, InboxReport, NatsError, NatsInbox, StreamShape};
use crate::{GroupView, Outbox};

/// How a group's instance takes part: [`GroupConfig::new`], changed with one setter per field.
///
/// `#[non_exhaustive]`: build it from [`new`](Self::new) and the setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupConfig {
    /// The group's name (default: the inbox's durable name): every instance of one consuming
    /// service uses the same, and one database.
    pub group: Option<String>,
    /// This instance's name in the group (default: `<host>-<process id>-<random>`, new at
    /// every start). Two running instances must never share one.
    pub member: String,
    /// How long an instance's lease, and its hold on a partition, lasts unless renewed
    /// (default 10 s); renewed every quarter of it. An instance killed without a word lets
    /// its partitions go after this (and its unacknowledged messages come back after the
    /// inbox's ack wait); one that cannot reach its database stops consuming after this.
    pub lease: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig::new()
    }
}

impl GroupConfig {
    /// The defaults above.
    pub fn new() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".into());
        let random = uuid::Uuid::now_v7().simple().to_string();
        GroupConfig {
            group: None,
            member: format!(
                "{host}-{}-{}",
                std::process::id(),
                &random[random.len() - 6..]
            ),
            lease: Duration::from_secs(10),
        }
    }

    /// With [`group`](Self::group) set.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// With [`member`](Self::member) set.
    pub fn member(mut self, member: impl Into<String>) -> Self {
        self.member = member.into();
        self
    }

    /// With [`lease`](Self::lease) set.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

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

/// The key of the unpartitioned consumer among the running partitions.
const UNPARTITIONED: u32 = u32::MAX;

/// A partition this instance consumes: the task and how to stop it.
struct Running {
    stop: CancellationToken,
    stopping: bool,
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
        let tick = self.lease / 4;
        let fetched = Arc::new(AtomicU64::new(0));
        let mut tasks: JoinSet<(u32, Result<InboxReport, NatsError>)> = JoinSet::new();
        let mut running: BTreeMap<u32, Running> = BTreeMap::new();
        let mut total = InboxReport::default();
        let mut fatal: Option<NatsError> = None;
        let (mut renewed, mut store_failing) = (Instant::now(), None::<Instant>);
        let (mut seen, mut last_activity) = (0u64, Instant::now());
        let mut held: Vec<u32> = Vec::new();
        let held_gauge =
            metrics::gauge!("events_nats_group_partitions_held", "group" => self.group.clone());
        let mut next_beat = tokio::time::Instant::now();
        tracing::info!(group = %self.group, member = %self.member, partitions = self.inbox.partitions, "inbox group: joining");
        while fatal.is_none() && !cancel.is_cancelled() {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    self.finished(done, &mut running, &mut total, &mut fatal).await;
                    continue;
                }
                _ = tokio::time::sleep_until(next_beat) => {}
            }
            next_beat = tokio::time::Instant::now() + tick;
            // Bounded: a database that hangs instead of failing must not keep this instance
            // consuming past its lease.
            let beat = tokio::time::timeout(
                tick,
                self.outbox
                    .store()
                    .group_heartbeat(&self.group, &self.member, self.lease),
            )
            .await
            .map_err(|_| format!("the database did not answer within {tick:?}"))
            .and_then(|r| r.map_err(|e| event_core::ErrorChain(&e).to_string()));
            match beat {
                Ok(view) => {
                    renewed = Instant::now();
                    if let Some(since) = store_failing.take() {
                        tracing::warn!(group = %self.group, member = %self.member, "inbox group: its database answers again after {}", crate::outbox::pause::human(since.elapsed()));
                    }
                    self.rebalance(&view, &mut running, &mut tasks, &fetched)
                        .await;
                    if unpartitioned {
                        self.unpartitioned(&mut running, &mut tasks, &fetched);
                    }
                }
                Err(e) => {
                    if store_failing.is_none() {
                        store_failing = Some(Instant::now());
                        tracing::warn!(group = %self.group, member = %self.member, error = %e, "inbox group: cannot renew its lease");
                    }
                    if renewed.elapsed() >= self.lease {
                        for (p, r) in running.iter_mut().filter(|(_, r)| !r.stopping) {
                            tracing::warn!(group = %self.group, member = %self.member, partition = p, "inbox group: lease lapsed (its database is unreachable): stops consuming the partition");
                            r.stop.cancel();
                            r.stopping = true;
                        }
                    }
                }
            }
            held_gauge.set(
                running
                    .iter()
                    .filter(|(&p, r)| p != UNPARTITIONED && !r.stopping)
                    .count() as f64,
            );
            let now_seen = fetched.load(Ordering::Relaxed);
            if now_seen != seen {
                (seen, last_activity) = (now_seen, Instant::now());
            }
            // A partition taken or given up restarts the idle time: what it brings has not
            // been waited for yet.
            let holding: Vec<u32> = running
                .iter()
                .filter(|(_, r)| !r.stopping)
                .map(|(&p, _)| p)
                .collect();
            if holding != held {
                (held, last_activity) = (holding, Instant::now());
            }
            if idle.is_some_and(|idle| last_activity.elapsed() >= idle) {
                break;
            }
        }
        // Out: every partition stops after its batch, is released, and the member leaves.
        for r in running.values() {
            r.stop.cancel();
        }
        while let Some(done) = tasks.join_next().await {
            self.finished(done, &mut running, &mut total, &mut fatal)
                .await;
        }
        held_gauge.set(0.0);
        if let Err(e) = self
            .outbox
            .store()
            .release_partitions(&self.group, &self.member, None, true)
            .await
        {
            tracing::warn!(group = %self.group, member = %self.member, error = %event_core::ErrorChain(&e), "inbox group: could not leave (its partitions lapse after the lease)");
        }
        tracing::info!(group = %self.group, member = %self.member, "inbox group: left");
        match fatal {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Stops what is no longer this instance's, starts what is.
    async fn rebalance(
        &self,
        view: &GroupView,
        running: &mut BTreeMap<u32, Running>,
        tasks: &mut JoinSet<(u32, Result<InboxReport, NatsError>)>,
        fetched: &Arc<AtomicU64>,
    ) {
        let mut live = view.live_members();
        if !live.contains(&self.member) {
            live.push(self.member.clone());
        }
        let plan = super::assign(&self.group, &live, self.inbox.partitions);
        let mine: BTreeSet<u32> = plan
            .get(&self.member)
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default();
        let held: BTreeSet<u32> = view.held_by(&self.member).into_iter().collect();
        for (p, r) in running.iter_mut().filter(|(_, r)| !r.stopping) {
            let why = if !held.contains(p) {
                Some("its hold lapsed")
            } else if !mine.contains(p) {
                Some("assigned to another instance")
            } else {
                None
            };
            if let Some(why) = why {
                tracing::info!(group = %self.group, member = %self.member, partition = p, "inbox group: hands the partition over ({why})");
                r.stop.cancel();
                r.stopping = true;
            }
        }
        let wanted: Vec<u32> = mine
            .iter()
            .copied()
            .filter(|p| !running.contains_key(p))
            .collect();
        for p in wanted {
            match self
                .outbox
                .store()
                .claim_partition(&self.group, p, &self.member, self.lease)
                .await
            {
                Ok(true) => {
                    tracing::info!(group = %self.group, member = %self.member, partition = p, "inbox group: takes the partition");
                    let stop = CancellationToken::new();
                    let config = self.inbox.clone().partition(p);
                    let config = InboxConfig {
                        durable: partition_durable(&self.inbox.durable, p),
                        ..config
                    };
                    let (js, outbox, fetched) =
                        (self.js.clone(), self.outbox.clone(), Arc::clone(fetched));
                    let token = stop.clone();
                    tasks.spawn(
                        async move { (p, consume(js, outbox, config, token, fetched).await) },
                    );
                    running.insert(
                        p,
                        Running {
                            stop,
                            stopping: false,
                        },
                    );
                }
                // Still another's: taken at a later round, once released or expired.
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(group = %self.group, partition = p, error = %event_core::ErrorChain(&e), "inbox group: could not claim a partition");
                }
            }
        }
    }

    /// Consumes the unpartitioned consumer while holding partition 0, stops it otherwise.
    fn unpartitioned(
        &self,
        running: &mut BTreeMap<u32, Running>,
        tasks: &mut JoinSet<(u32, Result<InboxReport, NatsError>)>,
        fetched: &Arc<AtomicU64>,
    ) {
        let first = running.get(&0).is_some_and(|r| !r.stopping)
            && !self.unpartitioned_gone.load(Ordering::Relaxed);
        match running.get_mut(&UNPARTITIONED) {
            Some(r) if !first && !r.stopping => {
                r.stop.cancel();
                r.stopping = true;
            }
            None if first => {
                let mut config = self.inbox.clone();
                config.unpartitioned = true;
                let stop = CancellationToken::new();
                let (js, outbox, fetched, token, gone) = (
                    self.js.clone(),
                    self.outbox.clone(),
                    Arc::clone(fetched),
                    stop.clone(),
                    Arc::clone(&self.unpartitioned_gone),
                );
                tasks.spawn(async move {
                    let (stream, durable) = (config.stream.clone(), config.durable.clone());
                    let result = match consume(js.clone(), outbox, config, token, fetched).await {
                        // Deleted once drained (the procedure's last step): done, not lost.
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
                    };
                    (UNPARTITIONED, result)
                });
                running.insert(
                    UNPARTITIONED,
                    Running {
                        stop,
                        stopping: false,
                    },
                );
            }
            _ => {}
        }
    }

    /// A partition's task ended: counted, released unless it is to be consumed again, a
    /// verdict kept.
    async fn finished(
        &self,
        done: Result<(u32, Result<InboxReport, NatsError>), tokio::task::JoinError>,
        running: &mut BTreeMap<u32, Running>,
        total: &mut InboxReport,
        fatal: &mut Option<NatsError>,
    ) {
        let (p, result) = match done {
            Ok(d) => d,
            Err(e) => {
                // A panic in a partition's task: its partition lapses; the group goes on.
                tracing::error!(group = %self.group, error = %e, "inbox group: a partition's task failed");
                return;
            }
        };
        running.remove(&p);
        let which = if p == UNPARTITIONED {
            "the unpartitioned consumer".to_owned()
        } else {
            format!("partition {p}")
        };
        match result {
            Ok(r) => *total += r,
            Err(e) => {
                tracing::error!(group = %self.group, member = %self.member, error = %event_core::ErrorChain(&e), "inbox group: the inbox of {which} stopped");
                fatal.get_or_insert(e);
            }
        }
        if p == UNPARTITIONED {
            return;
        }
        if let Err(e) = self
            .outbox
            .store()
            .release_partitions(&self.group, &self.member, Some(&[p]), false)
            .await
        {
            tracing::debug!(group = %self.group, partition = p, error = %event_core::ErrorChain(&e), "inbox group: could not release a partition (it lapses)");
        } else {
            tracing::info!(group = %self.group, member = %self.member, partition = p, "inbox group: released the partition");
        }
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
    let mut warned = false;
    let inbox = loop {
        match NatsInbox::new(&js, outbox.clone(), config.clone()).await {
            Ok(inbox) => break inbox.count_fetched(fetched),
            Err(e) if permanent(&e) => return Err(e),
            Err(e) => {
                if !warned {
                    tracing::warn!(durable = %config.durable, error = %event_core::ErrorChain(&e), "inbox group: cannot bind the partition's consumer yet; retrying every second");
                    warned = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return Ok(InboxReport::default()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    inbox.run(stop, None).await
}
