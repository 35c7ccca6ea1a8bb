//! The inbox: a durable pull consumer whose fetched batches are handed to the inbox core
//! ([`Outbox::receive`]: decoded, committed once into this service's outbox, de-duplicated by
//! event id, what cannot be accepted dead-lettered), then acknowledged or terminated as each
//! message's verdict says. What is NATS's own stays here: the consumer, the broker identity
//! it checks, and acks. It must not run handlers: the consuming outbox's engine does.

mod checks;
mod config;
mod identity;
mod refetch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures_util::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

pub use crate::inbox::InboxReport;
pub(in crate::transport::nats) use checks::preflight;
pub use config::{InboxConfig, ReceivedBatch};
pub(crate) use identity::observe;
use identity::{created, describe_observed, same_time};
pub use refetch::{Refetch, RefetchOutcome, RefetchReport, RefetchedGap};

use super::NatsError;
use crate::inbox::{Incoming, Origin, Verdict};
use crate::telemetry::{self, Messaging, Operation};
use crate::{InboxIdentity, Outbox, OutboxError};
use tracing::Instrument;

/// How often, at least, the inbox compares the broker's stream and consumer with the
/// identity it recorded (also after every failed fetch).
pub const IDENTITY_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// How long, beyond the consumer's redelivery delay, a three-server JetStream cluster takes
/// to resume delivering after losing a server — the stream's or the consumer's leader, the
/// server the clients were connected to — or after getting its quorum back: the election of
/// a new leader (NATS RAFT: 4 to 9 s), the clients' reconnection, an unconfirmed ack's
/// time-out, the relay's and the inbox's next round. `tests/tests/nats_cluster.rs` measures
/// it (BENCHMARKS.md: the worst was 17 s beyond the redelivery delay, a consumer leader's
/// loss); this is more than twice that.
///
/// [`NatsInbox::new`] refuses an [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after)
/// that does not exceed the consumer's redelivery delay plus this: a failover must not be
/// reported as a gap.
pub const FAILOVER_ALLOWANCE: Duration = Duration::from_secs(45);

/// How long past its expiry a fetch waits for the server to end it.
const FETCH_GRACE: Duration = Duration::from_millis(250);

/// The NATS JetStream inbox of a consuming service: see the [module docs](super).
pub struct NatsInbox {
    outbox: Outbox,
    js: jetstream::Context,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    config: InboxConfig,
    name: String,
    /// What the store recorded: the stream and consumer this inbox consumes.
    identity: InboxIdentity,
    /// When the identity was last found unchanged.
    verified: Mutex<Instant>,
    /// The highest stream sequence fetched or acknowledged so far: a batch starting past the
    /// next one may follow removed messages, and is checked before it is committed.
    seen: Mutex<u64>,
    /// Messages on a partition their aggregate does not belong to since the last log line
    /// about them, and when that was.
    misplaced: Mutex<(u64, Option<Instant>)>,
    /// Messages received on a partition their aggregate does not belong to, in all.
    mismatches: AtomicU64,
    /// Counts the messages fetched, for a group that watches its partitions' activity.
    fetched: Option<Arc<AtomicU64>>,
}

impl std::fmt::Debug for NatsInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsInbox")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
impl NatsInbox {
    /// Creates the durable pull consumer (explicit ack) or binds to it, and checks that the
    /// outbox's retention exceeds the consumer's redelivery horizon
    /// ([`InboxConfig::redelivery_horizon`]). On the first start it records the stream's and
    /// the consumer's creation times in the outbox's store ([`InboxIdentity`]); on every
    /// later one it compares them, and never creates a consumer the store says existed.
    ///
    /// # Errors
    /// [`NatsError::Config`] for an invalid configuration, in-transaction handlers not
    /// allowed, or an [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after) within the
    /// redelivery delay plus [`FAILOVER_ALLOWANCE`]; [`NatsError::RetentionTooShort`];
    /// [`NatsError::IdentityChanged`] when the stream or the consumer is not the one recorded
    /// (gone, or created anew); [`NatsError::MessagesLost`] when the stream removed messages
    /// the consumer had not acknowledged; [`NatsError::NoStream`] (first start) or
    /// [`NatsError::Broker`] when the stream or consumer cannot be had; [`NatsError::Store`]
    /// when the identity cannot be read or written.
    ///
    /// # Cancel safety
    /// Cancel safe: the consumer and the identity were created and recorded or not; calling
    /// again binds to them.
    pub async fn new(
        js: &jetstream::Context,
        outbox: Outbox,
        config: InboxConfig,
    ) -> Result<NatsInbox, NatsError> {
        preflight(&outbox, &config)?;
        let name = format!("nats-inbox:{}", config.durable);
        let recorded = outbox.store().inbox_identity(&name).await?;
        let observed = match observe(js, &config.stream, &config.durable).await {
            Err(NatsError::NoStream(stream)) => match recorded {
                Some(r) => {
                    return Err(NatsError::IdentityChanged {
                        inbox: name,
                        recorded: r.describe(),
                        found: format!("no stream `{stream}`"),
                    })
                }
                None => return Err(NatsError::NoStream(stream)),
            },
            other => other?,
        };
        if config.partitions > 1 && config.partition.is_none() && !config.unpartitioned {
            return Err(NatsError::Config(format!(
                "inbox `{name}`: a stream of {} partitions is read one partition per durable consumer: set InboxConfig::partition, or run a NatsGroup (one instance consumes every partition)",
                config.partitions
            )));
        }
        if observed.partitions != config.partitions && !config.unpartitioned {
            return Err(NatsError::PartitionsMismatch {
                stream: config.stream.clone(),
                what: format!("inbox `{name}`"),
                configured: config.partitions,
                found: observed.partitions,
            });
        }
        if let Some(r) = &recorded {
            let changed = r.stream != config.stream
                || !same_time(&r.stream_created, &observed.stream_created)
                || match (&r.consumer_created, &observed.consumer) {
                    (Some(want), Some((have, _))) => !same_time(want, have),
                    // The store says the consumer existed: never create it again (it would
                    // start over from the stream's first message, or miss what was lost).
                    (Some(_), None) => true,
                    (None, _) => false,
                };
            if changed {
                return Err(NatsError::IdentityChanged {
                    inbox: name,
                    recorded: r.describe(),
                    found: describe_observed(&config.stream, &config.durable, &observed),
                });
            }
        }
        let stream = js
            .get_stream(&config.stream)
            .await
            .map_err(NatsError::broker("get stream"))?;
        let wanted = pull::Config {
            durable_name: Some(config.durable.clone()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_deliver: config.max_deliver,
            backoff: config.backoff.clone(),
            max_ack_pending: config.max_ack_pending.unwrap_or(config.batch as i64),
            filter_subject: config.effective_filter().unwrap_or_default(),
            ..Default::default()
        };
        let consumer: jetstream::consumer::Consumer<pull::Config> = stream
            .get_or_create_consumer(&config.durable, wanted)
            .await
            .map_err(NatsError::broker("create consumer"))?;
        let have = &consumer.cached_info().config;
        if have.ack_policy != jetstream::consumer::AckPolicy::Explicit {
            return Err(NatsError::Config(format!(
                "consumer `{}` exists without explicit acks",
                config.durable
            )));
        }
        let mine = InboxIdentity::new(
            &name,
            &config.stream,
            &observed.stream_created,
            Some(created(consumer.cached_info().created)),
        );
        // First start (or the consumer an operator's adopt let it create): recorded, unless
        // another instance recorded first — then its identity must be this one.
        let identity = outbox.store().record_inbox_identity(&mine).await?;
        let same_consumer = match (&identity.consumer_created, &mine.consumer_created) {
            (Some(a), Some(b)) => same_time(a, b),
            (a, b) => a == b,
        };
        if !same_time(&identity.stream_created, &mine.stream_created) || !same_consumer {
            return Err(NatsError::IdentityChanged {
                inbox: name,
                recorded: identity.describe(),
                found: mine.describe(),
            });
        }
        // The inbox's counters exist from here on, at 0.
        crate::telemetry::catalog::register_zero(&[
            "events_nats_received_total",
            "events_nats_duplicates_total",
            "events_nats_dead_lettered_total",
            "events_nats_acked_total",
            "events_nats_terminated_total",
            "events_nats_naked_total",
            "events_nats_partition_mismatches_total",
        ]);
        let inbox = NatsInbox {
            name,
            outbox,
            js: js.clone(),
            consumer,
            config,
            identity,
            verified: Mutex::new(Instant::now()),
            seen: Mutex::new(0),
            misplaced: Mutex::new((0, None)),
            fetched: None,
            mismatches: AtomicU64::new(0),
        };
        inbox.verify().await?;
        Ok(inbox)
    }

    /// Compares the stream and durable consumer on the server with the identity this inbox
    /// recorded ([`InboxIdentity`], in the consuming store), and checks that the stream still
    /// holds every message the consumer has not acknowledged. Called by
    /// [`fetch_and_commit`](Self::fetch_and_commit) after every failed fetch and at least every
    /// [`IDENTITY_CHECK_INTERVAL`] (30 s).
    ///
    /// The loss check is conservative: when the stream's first sequence has passed the
    /// consumer's ack floor, messages the consumer never acknowledged were removed (the
    /// stream's limits, a purge, lost storage), which may include messages its subject filter
    /// would have skipped. It also runs before committing a fetched batch whose first stream
    /// sequence does not follow the highest one this inbox saw (while the hole still shows):
    /// with a subject filter that skips other subjects of the stream, that is often.
    ///
    /// # Errors
    /// [`NatsError::IdentityChanged`] when the stream or the consumer was deleted or created
    /// anew (a wiped broker); [`NatsError::MessagesLost`] when unacknowledged messages were
    /// removed; [`NatsError::Broker`] when the server cannot be asked (not a verdict: try
    /// again).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn verify(&self) -> Result<(), NatsError> {
        let observed = match observe(&self.js, &self.config.stream, &self.config.durable).await {
            Err(NatsError::NoStream(stream)) => {
                return Err(NatsError::IdentityChanged {
                    inbox: self.name.clone(),
                    recorded: self.identity.describe(),
                    found: format!("no stream `{stream}`"),
                })
            }
            other => other?,
        };
        let same_consumer = matches!(
            (&self.identity.consumer_created, &observed.consumer),
            (Some(want), Some((have, _))) if same_time(want, have)
        );
        if !same_time(&observed.stream_created, &self.identity.stream_created) || !same_consumer {
            return Err(NatsError::IdentityChanged {
                inbox: self.name.clone(),
                recorded: self.identity.describe(),
                found: describe_observed(&self.config.stream, &self.config.durable, &observed),
            });
        }
        if let Some((_, ack_floor)) = observed.consumer {
            {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                *seen = (*seen).max(ack_floor);
            }
            if observed.first_sequence > ack_floor.saturating_add(1) {
                return Err(NatsError::MessagesLost {
                    inbox: self.name.clone(),
                    stream: self.config.stream.clone(),
                    first_sequence: observed.first_sequence,
                    ack_floor,
                });
            }
        }
        *self.verified.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Ok(())
    }

    /// Counts every message it fetches in `counter` too.
    pub(super) fn count_fetched(mut self, counter: Arc<AtomicU64>) -> Self {
        self.fetched = Some(counter);
        self
    }

    /// Messages this inbox received on a partition their aggregate does not belong to under
    /// the stream's count ([`InboxConfig::partitions`]: a producer publishing with another
    /// count), since it was made; each was accepted as any other.
    pub fn partition_mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// The identity this inbox consumes, as recorded in the consuming store.
    pub fn identity(&self) -> &InboxIdentity {
        &self.identity
    }

    /// The handler name of this inbox's dead letters (`nats-inbox:<durable>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The consuming outbox.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Its configuration.
    pub fn config(&self) -> &InboxConfig {
        &self.config
    }

    /// Messages delivered to this consumer and not acknowledged (a crashed instance's batch:
    /// redelivered once `ack_wait` has passed), from the server.
    ///
    /// # Errors
    /// [`NatsError::Broker`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn ack_pending(&self) -> Result<usize, NatsError> {
        let mut consumer = self.consumer.clone();
        let info = consumer
            .info()
            .await
            .map_err(NatsError::broker("consumer info"))?;
        Ok(info.num_ack_pending)
    }

    /// Fetches one batch (waiting up to [`InboxConfig::fetch_wait`]) and hands it to the inbox
    /// core ([`Outbox::receive`]): every accepted event is committed into the outbox in one
    /// transaction (an id already there is skipped), and every message that cannot be accepted
    /// becomes a dead letter with its origin (transport `nats`, the stream, the stream
    /// sequence, the delivery count, attribute `subject`) — see the
    /// [inbox core](crate::inbox) for which and why. Acks nothing: call
    /// [`ReceivedBatch::ack`], which acknowledges the accepted and duplicate messages and
    /// terminates the dead-lettered ones.
    ///
    /// # Errors
    /// [`NatsError::Broker`] when the fetch fails; [`NatsError::Outbox`] when a commit fails
    /// otherwise (the database is down: every message of the batch is then nak'ed with a delay
    /// of one second, to be redelivered, and one already committed is skipped then).
    ///
    /// # Cancel safety
    /// Cancel safe: fetched messages that were not committed and acked are redelivered after
    /// `ack_wait`, and skipped when their commit had happened.
    pub async fn fetch_and_commit(&self) -> Result<ReceivedBatch, NatsError> {
        let due = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            >= IDENTITY_CHECK_INTERVAL;
        if due {
            self.verdict().await?;
        }
        match self.fetch().await {
            Ok(messages) => {
                // A batch that does not follow what was seen may come after removed messages:
                // the check runs before the commit, while the consumer's ack floor still
                // shows the hole (a subject filter that skips other subjects makes such
                // batches common, and each costs one check).
                let sequences = messages
                    .iter()
                    .filter_map(|m| m.info().ok())
                    .map(|i| i.stream_sequence);
                let (first, last) =
                    sequences.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
                let seen = *self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if first != u64::MAX && first > seen.saturating_add(1) {
                    // A consumer's info costs the server a count of its pending messages
                    // (a scan of the stream for a filtered consumer, holding up its
                    // deliveries): asked only when the stream's own first sequence says
                    // messages after what this inbox saw were removed.
                    let removed =
                        match identity::first_sequence(&self.js, &self.config.stream).await {
                            Ok(first_kept) => first_kept > seen.saturating_add(1),
                            Err(_) => true,
                        };
                    if removed {
                        self.verdict().await?;
                    }
                }
                {
                    let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                    *seen = (*seen).max(last);
                }
                self.commit(messages).await
            }
            // A failed fetch may be the first sign of a wiped broker: a verdict wins.
            Err(e) => {
                self.verdict().await?;
                Err(e)
            }
        }
    }

    /// [`verify`](Self::verify), keeping only a verdict about the broker's data (identity
    /// changed, messages lost): a server that cannot be asked now is not one.
    async fn verdict(&self) -> Result<(), NatsError> {
        match self.verify().await {
            Err(e) if e.is_fatal() => Err(e),
            _ => Ok(()),
        }
    }

    /// One batch: what the consumer has now, up to [`InboxConfig::batch`], without waiting;
    /// when it has nothing, the first message to arrive within
    /// [`InboxConfig::fetch_wait`] and what followed it. A pull request waits for its whole
    /// batch until it expires, so one request would hold a batch filled in part (the end of
    /// a backlog, a trickle of events) for the whole fetch wait.
    async fn fetch(&self) -> Result<Vec<jetstream::Message>, NatsError> {
        let mut messages = self.pull(self.config.batch, false).await?;
        if !messages.is_empty() {
            return Ok(messages);
        }
        messages = self.pull(1, true).await?;
        if !messages.is_empty() && self.config.batch > 1 {
            // Failing now, the next batch says so: these are in hand.
            if let Ok(more) = self.pull(self.config.batch - 1, false).await {
                messages.extend(more);
            }
        }
        Ok(messages)
    }

    /// One pull request for `n` messages: waiting for them up to the fetch wait, or (not
    /// `wait`) taking only what is there now.
    async fn pull(&self, n: usize, wait: bool) -> Result<Vec<jetstream::Message>, NatsError> {
        let batch = if wait {
            self.consumer
                .batch()
                .max_messages(n)
                .expires(self.config.fetch_wait)
                .messages()
                .await
        } else {
            self.consumer.fetch().max_messages(n).messages().await
        };
        let mut batch = batch.map_err(NatsError::broker("fetch"))?;
        // nats-server 2.9 does not always end a pull request that expired having delivered
        // part of its batch (its 408 comes only once another message or request makes it
        // look): async-nats then waits 5 s more. The batch ends at its expiry plus a grace
        // here, taking what already arrived; the server delivers nothing to an expired
        // request, and a message still on the wire then is redelivered after the ack wait.
        let deadline = tokio::time::Instant::now() + self.config.fetch_wait + FETCH_GRACE;
        let mut messages = Vec::new();
        loop {
            let next = match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(next) => next,
                Err(_) => {
                    while let Some(Some(Ok(m))) = batch.next().now_or_never() {
                        messages.push(m);
                    }
                    break;
                }
            };
            match next {
                Some(Ok(m)) => messages.push(m),
                Some(Err(e)) => {
                    if messages.is_empty() {
                        return Err(NatsError::Broker("fetch", e));
                    }
                    break;
                }
                None => break,
            }
        }
        Ok(messages)
    }

    /// Hands the batch to the inbox core ([`Outbox::receive`]) and sorts the messages by
    /// verdict: accepted and duplicates to ack, dead-lettered to terminate. When the core
    /// could not commit some (the store failed), every message is nak'ed with a delay of one
    /// second, to be redelivered (those committed are then duplicates).
    async fn commit(&self, messages: Vec<jetstream::Message>) -> Result<ReceivedBatch, NatsError> {
        metrics::counter!("events_nats_received_total").increment(messages.len() as u64);
        if let Some(fetched) = &self.fetched {
            fetched.fetch_add(messages.len() as u64, Ordering::Relaxed);
        }
        if self.config.partitions > 1 && !self.config.unpartitioned {
            let n = checks::count_misplaced(
                &self.name,
                self.config.partitions,
                &messages,
                &self.misplaced,
            );
            self.mismatches.fetch_add(n, Ordering::Relaxed);
        }
        let batch: Vec<Incoming> = messages.iter().map(incoming).collect();
        // `receive {stream}` of the messaging conventions (CONSUMER), linked to each
        // message's creation context; the commit into the outbox runs in it.
        let span = tracing::info_span!(
            "receive",
            stream = %self.config.stream,
            consumer = %self.config.durable,
            messages = messages.len(),
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
        );
        telemetry::describe(
            &span,
            Messaging::new(
                Operation::Receive,
                telemetry::SYSTEM_NATS,
                &self.config.stream,
            )
            .group(&self.config.durable)
            .batch(messages.len()),
            None,
            false,
        );
        telemetry::link_each(&span, messages.iter().map(|m| &m.payload[..]));
        let receipt = self
            .outbox
            .receive(&self.name, batch)
            .instrument(span.clone())
            .await;
        if receipt.error.is_some() {
            telemetry::failed(&span, "store");
        }
        drop(span);
        metrics::counter!("events_nats_duplicates_total")
            .increment(receipt.report.duplicates as u64);
        metrics::counter!("events_nats_dead_lettered_total")
            .increment(receipt.new_dead_letters() as u64);
        if let Some(e) = receipt.error {
            let naks = messages
                .iter()
                .map(|m| m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))));
            let n = futures_util::future::join_all(naks).await.len();
            metrics::counter!("events_nats_naked_total").increment(n as u64);
            return Err(NatsError::Outbox(e));
        }
        let (mut accepted, mut poison) = (Vec::new(), Vec::new());
        for (m, verdict) in messages.into_iter().zip(receipt.verdicts) {
            match verdict {
                Verdict::DeadLettered(_) => poison.push(m),
                _ => accepted.push(m),
            }
        }
        Ok(ReceivedBatch {
            accepted,
            poison,
            report: receipt.report,
            stream: self.config.stream.clone(),
            durable: self.config.durable.clone(),
        })
    }

    /// Replays this inbox's dead letters `ids` through the inbox core
    /// ([`Outbox::replay_inbox_dead_letters`], which needs no broker connection), skipping
    /// the dead letters of other inboxes: each is decoded again (a deploy that knows its
    /// type) and committed into the outbox as if just received, marked replayed, with one
    /// audit row, all in one transaction.
    ///
    /// # Errors
    /// [`NatsError::Replay`] when one still does not decode (nothing is changed);
    /// [`NatsError::Outbox`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn replay_dead_letters(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<InboxReport, NatsError> {
        self.outbox
            .replay_received(ids, Some(&self.name), actor, reason)
            .await
            .map_err(|e| match e {
                OutboxError::NotReplayable {
                    dead_letter,
                    source,
                } => NatsError::Replay(dead_letter, source),
                e => NatsError::Outbox(e),
            })
    }

    /// Re-fetches the open gaps `ids` (every open gap with `None`) from this inbox's stream:
    /// [`Refetch::run`] with this inbox's stream and durable consumer.
    ///
    /// # Errors
    /// As [`Refetch::run`].
    ///
    /// # Cancel safety
    /// As [`Refetch::run`].
    pub async fn refetch_gaps(
        &self,
        ids: Option<&[i64]>,
        actor: &str,
        reason: &str,
    ) -> Result<RefetchReport, NatsError> {
        let mut refetch = Refetch::new(&self.config.stream, &self.config.durable);
        if let Some(ids) = ids {
            refetch = refetch.gaps(ids.to_vec());
        }
        refetch.run(&self.js, &self.outbox, actor, reason).await
    }

    /// Fetches, commits and acks one batch.
    ///
    /// # Errors
    /// As [`fetch_and_commit`](Self::fetch_and_commit).
    ///
    /// # Cancel safety
    /// As [`fetch_and_commit`](Self::fetch_and_commit).
    pub async fn receive(&self) -> Result<InboxReport, NatsError> {
        Ok(self.fetch_and_commit().await?.ack().await)
    }

    /// Receives batches until `cancel` fires or, with `idle`, until no message has arrived for
    /// that long. A failed batch is retried after a second (its messages are redelivered);
    /// an outage's first failure is logged (warn), then at most one line a minute, and its end
    /// with its length. The loop stops only on a verdict about the broker's data.
    ///
    /// # Errors
    /// [`NatsError::IdentityChanged`] and [`NatsError::MessagesLost`] ([`NatsError::is_fatal`]):
    /// the broker lost or re-created what this inbox consumes, and events may never arrive.
    /// Nothing else stops the loop.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`receive`](Self::receive); prefer `cancel`, which lets the batch in
    /// hand be acked.
    pub async fn run(
        &self,
        cancel: CancellationToken,
        idle: Option<Duration>,
    ) -> Result<InboxReport, NatsError> {
        let mut total = InboxReport::default();
        let mut last = Instant::now();
        // Failing since, failures since the last warning, and when that was.
        let mut failing: Option<(Instant, u64, Instant)> = None;
        while !cancel.is_cancelled() {
            match self.receive().await {
                Ok(r) => {
                    if r.received > 0 {
                        last = Instant::now();
                    }
                    total += r;
                    if let Some((since, _, _)) = failing.take() {
                        tracing::warn!(inbox = %self.name, outage_s = since.elapsed().as_secs_f64(), "inbox receiving again after {}", crate::outbox::pause::human(since.elapsed()));
                    }
                }
                Err(e) if e.is_fatal() => {
                    tracing::error!(inbox = %self.name, error = %event_core::ErrorChain(&e), "inbox stopped");
                    return Err(e);
                }
                Err(e) => {
                    // The first failure of an outage, then at most one line a minute (a
                    // cluster electing a leader, a broker away): each batch is retried.
                    let now = Instant::now();
                    let first = failing.is_none();
                    let (since, count, warned) = failing.get_or_insert((now, 0, now));
                    *count += 1;
                    if first || warned.elapsed() >= Duration::from_secs(60) {
                        tracing::warn!(inbox = %self.name, error = %event_core::ErrorChain(&e), failures = *count, failing_s = since.elapsed().as_secs(), "inbox batch failed; retrying every second");
                        *warned = now;
                        *count = 0;
                    } else {
                        tracing::debug!(inbox = %self.name, error = %event_core::ErrorChain(&e), "inbox batch failed; retrying");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
            if idle.is_some_and(|idle| last.elapsed() >= idle) {
                break;
            }
        }
        Ok(total)
    }
}

/// A fetched message as the inbox core takes it: the body, its `Content-Type` and
/// `Nats-Msg-Id` headers, and its origin (transport `nats`, the stream, the stream sequence,
/// the delivery count, attribute `subject`).
fn incoming(m: &jetstream::Message) -> Incoming {
    let info = m.info().ok();
    let origin = Origin::new(
        "nats",
        info.as_ref().map_or("", |i| i.stream),
        info.as_ref().map_or(0, |i| i.stream_sequence),
    )
    .delivery_count(info.as_ref().map_or(1, |i| i.delivered.max(1) as u64))
    .attribute("subject", m.subject.to_string());
    let mut incoming = Incoming::new(m.payload.to_vec(), origin);
    if let Some(h) = &m.headers {
        if let Some(ct) = h.get("Content-Type") {
            incoming = incoming.content_type(ct.as_str());
        }
        if let Some(id) = h.get(async_nats::header::NATS_MESSAGE_ID) {
            incoming = incoming.message_id(id.as_str());
        }
    }
    incoming
}
