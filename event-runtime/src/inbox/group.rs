//! A group of inbox instances sharing a transport's partitions (a NATS stream's, a RabbitMQ
//! exchange's queues) through leases in the consuming database: each instance renews its
//! lease, computes the same assignment of partitions over the live instances
//! ([`assign`](crate::transport::assign)), consumes the partitions assigned to it — through
//! the transport's own consumer of each — and hands over the others. Correctness never
//! depends on it (the inbox core's chains keep each aggregate's order, its de-duplication
//! makes each event's effects once, whoever commits it): it bounds what a dead instance delays
//! to its share, and lets consumption grow with instances. The transports' groups
//! ([`NatsGroup`](crate::transport::nats::NatsGroup),
//! [`AmqpGroup`](crate::transport::rabbitmq::AmqpGroup)) run this loop with their consumer.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::inbox::InboxReport;
use crate::{GroupView, Outbox};

/// How an instance of a group of inboxes ([`NatsGroup`](crate::transport::nats::NatsGroup),
/// [`AmqpGroup`](crate::transport::rabbitmq::AmqpGroup)) takes part: [`GroupConfig::new`], changed with one setter per field.
///
/// `#[non_exhaustive]`: build it from [`new`](Self::new) and the setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupConfig {
    /// The group's name (default: the inbox's durable name on NATS, the consuming service's
    /// name on RabbitMQ): every instance of one consuming service uses the same, and one
    /// database.
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

/// What consuming one partition does until its token fires (its report, or why it stopped
/// for good).
pub(crate) type Consume<E> = Pin<Box<dyn Future<Output = Result<InboxReport, E>> + Send>>;

/// Opens a partition's inbox with `open`, again every second while it fails with an error
/// that waiting may cure (`permanent` says which do not: returned), logging the first failure
/// with `what` (the queue or consumer); `Ok(None)` when `stop` fires first.
pub(crate) async fn open_retrying<T, E, Fut>(
    what: &str,
    stop: &CancellationToken,
    mut open: impl FnMut() -> Fut,
    permanent: impl Fn(&E) -> bool,
) -> Result<Option<T>, E>
where
    Fut: Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    let mut warned = false;
    loop {
        match open().await {
            Ok(inbox) => return Ok(Some(inbox)),
            Err(e) if permanent(&e) => return Err(e),
            Err(e) => {
                if !warned {
                    tracing::warn!(partition = %what, error = %event_core::ErrorChain(&e), "inbox group: cannot consume the partition yet; retrying every second");
                    warned = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// One instance of a group, as a transport describes it.
pub(crate) struct Group<'a> {
    /// The consuming outbox, whose store holds the leases.
    pub outbox: &'a Outbox,
    /// The group's name.
    pub group: &'a str,
    /// This instance's name in it.
    pub member: &'a str,
    /// How long a lease lasts unless renewed (renewed every quarter of it).
    pub lease: Duration,
    /// The partitions shared.
    pub partitions: u32,
    /// The gauge of the partitions this instance holds (`events_nats_group_partitions_held`).
    pub gauge: metrics::Gauge,
}

/// A partition this instance consumes: how to stop it.
struct Running {
    stop: CancellationToken,
    stopping: bool,
}

type Tasks<E> = JoinSet<(u32, Result<InboxReport, E>)>;

impl Group<'_> {
    /// Takes part in the group until `cancel` fires or, with `idle`, until none of its
    /// partitions received a message for that long (`fetched` counts them; a partition taken
    /// or given up restarts that time); `start(p, stop)` consumes partition `p` until `stop`.
    /// See [`NatsGroup::run`](crate::transport::nats::NatsGroup::run) for what it does and
    /// when; the first error a partition returns stops the group, after the other partitions
    /// stopped.
    pub(crate) async fn run<E>(
        &self,
        cancel: CancellationToken,
        idle: Option<Duration>,
        fetched: Arc<AtomicU64>,
        mut start: impl FnMut(u32, CancellationToken) -> Consume<E>,
    ) -> Result<InboxReport, E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let tick = self.lease / 4;
        let mut tasks: Tasks<E> = JoinSet::new();
        let mut running: BTreeMap<u32, Running> = BTreeMap::new();
        let mut total = InboxReport::default();
        let mut fatal: Option<E> = None;
        let (mut renewed, mut store_failing) = (Instant::now(), None::<Instant>);
        let (mut seen, mut last_activity) = (0u64, Instant::now());
        let mut held: Vec<u32> = Vec::new();
        let held_gauge = &self.gauge;
        let mut next_beat = tokio::time::Instant::now();
        tracing::info!(group = %self.group, member = %self.member, partitions = self.partitions, "inbox group: joining");
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
                    .group_heartbeat(self.group, self.member, self.lease),
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
                    self.rebalance(&view, &mut running, &mut tasks, &mut start)
                        .await;
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
            let holding: Vec<u32> = running
                .iter()
                .filter(|(_, r)| !r.stopping)
                .map(|(&p, _)| p)
                .collect();
            held_gauge.set(holding.len() as f64);
            let now_seen = fetched.load(Ordering::Relaxed);
            if now_seen != seen {
                (seen, last_activity) = (now_seen, Instant::now());
            }
            // A partition taken or given up restarts the idle time: what it brings has not
            // been waited for yet.
            if holding != held {
                (held, last_activity) = (holding, Instant::now());
            }
            if store_failing.is_none() && idle.is_some_and(|idle| last_activity.elapsed() >= idle) {
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
            .release_partitions(self.group, self.member, None, true)
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
    async fn rebalance<E: Send + 'static>(
        &self,
        view: &GroupView,
        running: &mut BTreeMap<u32, Running>,
        tasks: &mut Tasks<E>,
        start: &mut impl FnMut(u32, CancellationToken) -> Consume<E>,
    ) {
        let mut live = view.live_members();
        if !live.iter().any(|m| m == self.member) {
            live.push(self.member.to_owned());
        }
        let plan = crate::transport::assign(self.group, &live, self.partitions);
        let mine: BTreeSet<u32> = plan
            .get(self.member)
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default();
        let held: BTreeSet<u32> = view.held_by(self.member).into_iter().collect();
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
                .claim_partition(self.group, p, self.member, self.lease)
                .await
            {
                Ok(true) => {
                    tracing::info!(group = %self.group, member = %self.member, partition = p, "inbox group: takes the partition");
                    let stop = CancellationToken::new();
                    let consume = start(p, stop.clone());
                    tasks.spawn(async move { (p, consume.await) });
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

    /// A partition's task ended: counted, released, a verdict kept.
    async fn finished<E: std::error::Error + 'static>(
        &self,
        done: Result<(u32, Result<InboxReport, E>), tokio::task::JoinError>,
        running: &mut BTreeMap<u32, Running>,
        total: &mut InboxReport,
        fatal: &mut Option<E>,
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
        match result {
            Ok(r) => *total += r,
            Err(e) => {
                tracing::error!(group = %self.group, member = %self.member, error = %event_core::ErrorChain(&e), "inbox group: the inbox of partition {p} stopped");
                fatal.get_or_insert(e);
            }
        }
        if let Err(e) = self
            .outbox
            .store()
            .release_partitions(self.group, self.member, Some(&[p]), false)
            .await
        {
            tracing::debug!(group = %self.group, partition = p, error = %event_core::ErrorChain(&e), "inbox group: could not release a partition (it lapses)");
        } else {
            tracing::info!(group = %self.group, member = %self.member, partition = p, "inbox group: released the partition");
        }
    }
}
