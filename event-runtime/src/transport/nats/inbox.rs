//! The inbox: a durable pull consumer whose fetched batches are decoded through the registry
//! and committed once into this service's outbox (de-duplicated by event id), then
//! acknowledged. It must not run handlers: the consuming outbox's engine does.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, AckKind};
use event_core::{AnyEnvelope, DecodeError, RawEnvelope};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{NatsError, CONTENT_TYPE};
use crate::store::{BrokerMetadata, DeadLetterReason};
use crate::{Outbox, OutboxError, SqlValue, StoreError};

/// How the inbox consumes: its durable consumer and its batches.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// The stream to read.
    pub stream: String,
    /// The durable consumer's name: the inbox's identity on the server, and (as
    /// `nats-inbox:<durable>`) the handler name of its dead letters.
    pub durable: String,
    /// One subject filter (nats-server 2.9 takes one); `None`: the whole stream.
    pub filter_subject: Option<String>,
    /// Messages fetched and committed at once (default 64).
    pub batch: usize,
    /// How long one fetch waits for messages (default 1 s).
    pub fetch_wait: Duration,
    /// How long the server waits for the ack of a delivered message before redelivering it
    /// (default 30 s): comfortably above the time to commit one batch.
    pub ack_wait: Duration,
    /// Deliveries of one message at most (default 50). The server stops redelivering a message
    /// after that, so it is high: a message is acked as soon as its batch commits, and is
    /// redelivered only while the consuming database is unreachable.
    pub max_deliver: i64,
    /// Waits before each redelivery after an ack timeout (default none: `ack_wait` each). At
    /// most `max_deliver` entries. (A plain Nak redelivers at once: the backoff applies to ack
    /// timeouts only.)
    pub backoff: Vec<Duration>,
    /// Messages delivered and not acked at most (default: `batch`): the consumer never hands
    /// out more than one batch that this inbox has not settled.
    pub max_ack_pending: Option<i64>,
}

impl InboxConfig {
    /// A durable consumer `durable` of `stream`, with the defaults above.
    pub fn new(stream: impl Into<String>, durable: impl Into<String>) -> Self {
        InboxConfig {
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: None,
            batch: 64,
            fetch_wait: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
            max_deliver: 50,
            backoff: Vec::new(),
            max_ack_pending: None,
        }
    }

    /// The longest a message can be redelivered after its first delivery: the consuming
    /// outbox must remember its event id that long.
    pub fn redelivery_horizon(&self) -> Duration {
        let n = self.max_deliver.max(1) as usize;
        if self.backoff.is_empty() {
            return self.ack_wait * n as u32;
        }
        (0..n)
            .map(|i| self.backoff[i.min(self.backoff.len() - 1)])
            .sum::<Duration>()
            + self.ack_wait
    }

    fn validate(&self) -> Result<(), NatsError> {
        let bad = |m: String| Err(NatsError::Config(m));
        if self.batch == 0 || self.fetch_wait.is_zero() || self.ack_wait.is_zero() {
            return bad("batch, fetch_wait and ack_wait must be positive".into());
        }
        if self.max_deliver <= 0 {
            return bad("max_deliver must be positive (an unlimited one has no redelivery horizon for the outbox to cover)".into());
        }
        if self.backoff.len() as i64 > self.max_deliver {
            return bad(format!(
                "backoff has {} entries, more than max_deliver ({})",
                self.backoff.len(),
                self.max_deliver
            ));
        }
        if self.max_ack_pending.is_some_and(|m| m < self.batch as i64) {
            return bad("max_ack_pending must be at least batch".into());
        }
        Ok(())
    }
}

/// What receiving did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxReport {
    /// Messages fetched.
    pub received: usize,
    /// Events committed into the outbox.
    pub appended: usize,
    /// Events whose id the outbox had already (redeliveries, re-publishes): skipped.
    pub duplicates: usize,
    /// Messages put in the dead letter queue (and terminated).
    pub dead_lettered: usize,
    /// Acks the server confirmed.
    pub acked: usize,
    /// Acks not confirmed (the message will be redelivered and skipped as a duplicate).
    pub ack_failed: usize,
}

impl std::ops::AddAssign for InboxReport {
    fn add_assign(&mut self, o: Self) {
        self.received += o.received;
        self.appended += o.appended;
        self.duplicates += o.duplicates;
        self.dead_lettered += o.dead_lettered;
        self.acked += o.acked;
        self.ack_failed += o.ack_failed;
    }
}

/// A fetched batch committed into the outbox, not yet acknowledged. [`ack`](Self::ack) it;
/// dropped instead, its messages are redelivered after `ack_wait` and skipped as duplicates.
#[derive(Debug)]
#[must_use = "a received batch is redelivered unless acked"]
pub struct ReceivedBatch {
    accepted: Vec<jetstream::Message>,
    poison: Vec<jetstream::Message>,
    report: InboxReport,
}

impl ReceivedBatch {
    /// What was committed.
    pub fn report(&self) -> InboxReport {
        self.report
    }

    /// Acknowledges every committed message and terminates every dead-lettered one, each
    /// confirmed by the server (double ack).
    ///
    /// # Cancel safety
    /// Cancel safe: a message whose ack was not confirmed is redelivered and skipped.
    pub async fn ack(self) -> InboxReport {
        let mut report = self.report;
        let acks = self.accepted.iter().map(|m| m.double_ack());
        let terms = self.poison.iter().map(|m| m.double_ack_with(AckKind::Term));
        for r in futures_util::future::join_all(acks).await {
            match r {
                Ok(()) => report.acked += 1,
                Err(e) => {
                    report.ack_failed += 1;
                    tracing::warn!(error = %e, "inbox ack not confirmed: the message will be redelivered");
                }
            }
        }
        metrics::counter!("events_nats_acked_total").increment(report.acked as u64);
        let terminated = futures_util::future::join_all(terms).await;
        let ok = terminated.iter().filter(|r| r.is_ok()).count();
        metrics::counter!("events_nats_terminated_total").increment(ok as u64);
        report.ack_failed += terminated.len() - ok;
        report
    }
}

/// The NATS JetStream inbox of a consuming service: see the [module docs](super).
pub struct NatsInbox {
    outbox: Outbox,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    config: InboxConfig,
    name: String,
}

impl std::fmt::Debug for NatsInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsInbox")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

enum Refused {
    Poison(DeadLetterReason, Vec<String>, Option<Box<RawEnvelope>>),
}

/// A message of the batch that decoded: `idx` in the batch, its envelope (taken by a commit),
/// and how it is stored (the JSON as received, keyed `<aggregate type>@<source>`).
struct Candidate {
    idx: usize,
    envelope: Option<Box<dyn AnyEnvelope>>,
    raw: RawEnvelope,
    json: String,
    key: String,
}

/// A message of the batch that goes to the dead letter queue, and why.
struct Poison {
    idx: usize,
    reason: DeadLetterReason,
    chain: Vec<String>,
    raw: Option<Box<RawEnvelope>>,
}

/// The dead letter of a message whose commit alone failed with `conflict`.
fn conflicting(c: Candidate, conflict: &StoreError) -> Poison {
    let m = &c.raw.meta;
    Poison {
        idx: c.idx,
        reason: DeadLetterReason::Conflict,
        chain: vec![
            format!(
                "event {} conflicts with a stored event: {} {} already has sequence {} under another event id (purge this dead letter if the stored event is the one to keep; a replay commits it once that place is free)",
                m.id, c.key, m.aggregate_id, m.sequence
            ),
            conflict.to_string(),
        ],
        raw: Some(Box::new(c.raw)),
    }
}

/// The dead-letter reason of a commit error that refuses one message for good (committing it
/// again would fail again, and block the stream), `None` for one worth retrying (the
/// database is down, a transient handler failure).
fn refusal(e: &OutboxError) -> Option<DeadLetterReason> {
    match e {
        OutboxError::Store(StoreError::Conflict { .. }) => Some(DeadLetterReason::Conflict),
        OutboxError::Store(StoreError::SequenceOutOfRange { .. })
        | OutboxError::TooLarge { .. }
        | OutboxError::Unstorable { .. } => Some(DeadLetterReason::Undecodable),
        // A handler that panicked, or failed with a permanent error: it would again.
        OutboxError::Aborted(c) => match &c.error {
            Some(source) if !source.0.is_permanent() => None,
            _ => Some(DeadLetterReason::Permanent),
        },
        _ => None,
    }
}

/// The dead letter of a message its commit refused for good (`refusal`).
fn refused(c: Candidate, reason: DeadLetterReason, error: &OutboxError) -> Poison {
    let m = &c.raw.meta;
    let mut chain = vec![format!(
        "event {} ({} {} sequence {}) was refused when committed into this outbox; a replay commits it again once the cause is fixed",
        m.id, c.key, m.aggregate_id, m.sequence
    )];
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = source {
        chain.push(e.to_string());
        source = e.source();
    }
    Poison {
        idx: c.idx,
        reason,
        chain,
        raw: Some(Box::new(c.raw)),
    }
}

impl NatsInbox {
    /// Creates the durable pull consumer (explicit ack) or binds to it, and checks that the
    /// outbox's retention exceeds the consumer's redelivery horizon
    /// ([`InboxConfig::redelivery_horizon`]).
    ///
    /// # Errors
    /// [`NatsError::Config`]; [`NatsError::RetentionTooShort`]; [`NatsError::NoStream`] or
    /// [`NatsError::Broker`] when the stream or consumer cannot be had.
    ///
    /// # Cancel safety
    /// Cancel safe: the consumer was created or not; calling again binds to it.
    pub async fn new(
        js: &jetstream::Context,
        outbox: Outbox,
        config: InboxConfig,
    ) -> Result<NatsInbox, NatsError> {
        config.validate()?;
        let horizon = config.redelivery_horizon();
        let retention = outbox.config().retention;
        if retention <= horizon {
            return Err(NatsError::RetentionTooShort { retention, horizon });
        }
        super::StreamShape::fetch(js, &config.stream).await?;
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
            filter_subject: config.filter_subject.clone().unwrap_or_default(),
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
        Ok(NatsInbox {
            name: format!("nats-inbox:{}", config.durable),
            outbox,
            consumer,
            config,
        })
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

    /// Fetches one batch (waiting up to [`InboxConfig::fetch_wait`]) and commits it into the
    /// outbox in one transaction: every accepted event (an id already there is skipped), and
    /// every message that cannot be accepted as a dead letter with its broker metadata. Acks
    /// nothing: call [`ReceivedBatch::ack`].
    ///
    /// Messages that cannot be accepted: one that does not decode (`undecodable`), of an
    /// unknown name or version (`unknown_event`), and one whose (aggregate, sequence) the
    /// outbox already holds under another event id, or that an earlier message of the batch
    /// claims (`conflict`; a producer that re-published its events with new ids). When the
    /// batch's commit fails with [`StoreError::Conflict`], the messages of the aggregate it
    /// names (all of them, when it names none) are taken out, the rest is committed, and those
    /// are committed one at a time in stream order: each that conflicts becomes a dead letter
    /// (in a transaction of its own) instead of blocking the stream.
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
        let mut batch = self
            .consumer
            .batch()
            .max_messages(self.config.batch)
            .expires(self.config.fetch_wait)
            .messages()
            .await
            .map_err(NatsError::broker("fetch"))?;
        let mut messages = Vec::new();
        while let Some(m) = batch.next().await {
            match m {
                Ok(m) => messages.push(m),
                Err(e) => {
                    if messages.is_empty() {
                        return Err(NatsError::Broker("fetch", e));
                    }
                    break;
                }
            }
        }
        self.commit(messages).await
    }

    async fn commit(&self, messages: Vec<jetstream::Message>) -> Result<ReceivedBatch, NatsError> {
        let mut report = InboxReport {
            received: messages.len(),
            ..InboxReport::default()
        };
        metrics::counter!("events_nats_received_total").increment(messages.len() as u64);
        if messages.is_empty() {
            return Ok(ReceivedBatch {
                accepted: Vec::new(),
                poison: Vec::new(),
                report,
            });
        }
        let now = self.outbox.clock().now_ms();
        let mut candidates = Vec::new();
        let mut poison = Vec::new();
        for (idx, m) in messages.iter().enumerate() {
            match self.accept(m) {
                Ok((envelope, raw, json, key)) => candidates.push(Candidate {
                    idx,
                    envelope: Some(envelope),
                    raw,
                    json,
                    key,
                }),
                Err(Refused::Poison(reason, chain, raw)) => poison.push(Poison {
                    idx,
                    reason,
                    chain,
                    raw,
                }),
            }
        }
        // The batch is committed at once. A conflict (an (aggregate, sequence) the outbox
        // holds under another event id, or that two messages of the batch claim) would fail
        // it on every redelivery: the messages of the aggregate it names are taken out and
        // committed one at a time, in order, after the rest; a conflict naming no message
        // takes them all out. Each round takes one message out at least.
        let mut accepted = Vec::new();
        let mut deferred = Vec::new();
        loop {
            let mut envelopes = Vec::with_capacity(candidates.len());
            for mut c in std::mem::take(&mut candidates) {
                match self.envelope(&mut c) {
                    Ok(e) => {
                        envelopes.push(e);
                        candidates.push(c);
                    }
                    Err(p) => poison.push(p),
                }
            }
            let attempt = async {
                let mut uow = self.outbox.begin().await?;
                for p in &poison {
                    insert_dead_letter(uow.tx(), &self.name, &messages[p.idx], p, now).await?;
                }
                for (c, envelope) in candidates.iter().zip(envelopes) {
                    let _span =
                        tracing::debug_span!("receive", event_id = %c.raw.meta.id).entered();
                    uow.add_received(envelope, c.json.clone(), c.key.clone());
                }
                uow.commit().await
            }
            .await;
            match attempt {
                Ok(r) => {
                    report.appended += r.appended;
                    report.duplicates += r.duplicates;
                    accepted.extend(candidates.iter().map(|c| c.idx));
                    break;
                }
                Err(OutboxError::Store(StoreError::Conflict {
                    aggregate_type,
                    aggregate_id,
                    sequence,
                })) if !candidates.is_empty() => {
                    let named = |c: &Candidate| {
                        c.key == aggregate_type
                            && c.raw.meta.aggregate_id == aggregate_id
                            && c.raw.meta.sequence == sequence
                    };
                    let out: Vec<Candidate> = if candidates.iter().any(named) {
                        let (out, keep): (Vec<Candidate>, Vec<Candidate>) =
                            std::mem::take(&mut candidates).into_iter().partition(|c| {
                                c.key == aggregate_type && c.raw.meta.aggregate_id == aggregate_id
                            });
                        candidates = keep;
                        out
                    } else {
                        std::mem::take(&mut candidates)
                    };
                    tracing::warn!(
                        aggregate = %format!("{aggregate_type} {aggregate_id}"),
                        sequence,
                        messages = out.len(),
                        "inbox batch refused: an (aggregate, sequence) conflict; committing those messages one at a time"
                    );
                    deferred.extend(out);
                }
                // Another refusal of one message (an in-transaction handler that fails for
                // good, a sequence out of range, U+0000 in an aggregate id, an envelope over
                // this outbox's limit): not named, so every message alone.
                Err(e) if refusal(&e).is_some() && !candidates.is_empty() => {
                    tracing::warn!(
                        error = %event_core::ErrorChain(&e),
                        messages = candidates.len(),
                        "inbox batch refused; committing its messages one at a time"
                    );
                    deferred.append(&mut candidates);
                }
                Err(e) => return Err(self.give_back(&messages, e).await),
            }
        }
        deferred.sort_by_key(|c| c.idx);
        for mut c in deferred {
            let envelope = match self.envelope(&mut c) {
                Ok(e) => e,
                Err(p) => {
                    if let Err(e) = self.dead_letter_alone(&messages, &p, now).await {
                        return Err(self.give_back(&messages, e).await);
                    }
                    poison.push(p);
                    continue;
                }
            };
            let attempt = async {
                let mut uow = self.outbox.begin().await?;
                uow.add_received(envelope, c.json.clone(), c.key.clone());
                uow.commit().await
            }
            .await;
            match attempt {
                Ok(r) => {
                    report.appended += r.appended;
                    report.duplicates += r.duplicates;
                    accepted.push(c.idx);
                }
                Err(OutboxError::Store(e @ StoreError::Conflict { .. })) => {
                    let p = conflicting(c, &e);
                    if let Err(e) = self.dead_letter_alone(&messages, &p, now).await {
                        return Err(self.give_back(&messages, e).await);
                    }
                    poison.push(p);
                }
                Err(e) if refusal(&e).is_some() => {
                    let reason = refusal(&e).unwrap_or(DeadLetterReason::Permanent);
                    let p = refused(c, reason, &e);
                    if let Err(e) = self.dead_letter_alone(&messages, &p, now).await {
                        return Err(self.give_back(&messages, e).await);
                    }
                    poison.push(p);
                }
                Err(e) => return Err(self.give_back(&messages, e).await),
            }
        }
        report.dead_lettered = poison.len();
        metrics::counter!("events_nats_duplicates_total").increment(report.duplicates as u64);
        let mut messages: Vec<Option<jetstream::Message>> =
            messages.into_iter().map(Some).collect();
        let mut take = |idx: usize| messages[idx].take();
        let accepted: Vec<jetstream::Message> =
            accepted.into_iter().filter_map(&mut take).collect();
        let poison: Vec<jetstream::Message> =
            poison.into_iter().filter_map(|p| take(p.idx)).collect();
        Ok(ReceivedBatch {
            accepted,
            poison,
            report,
        })
    }

    /// The decoded envelope of `c`: the one `accept` decoded, or decoded again (a retried
    /// commit consumed it).
    fn envelope(&self, c: &mut Candidate) -> Result<Box<dyn AnyEnvelope>, Poison> {
        if let Some(e) = c.envelope.take() {
            return Ok(e);
        }
        self.outbox
            .dispatcher()
            .registry()
            .decode(&c.raw)
            .map_err(|e| Poison {
                idx: c.idx,
                reason: DeadLetterReason::Undecodable,
                chain: chain(&e),
                raw: Some(Box::new(c.raw.clone())),
            })
    }

    /// Stores one dead letter in a transaction of its own.
    async fn dead_letter_alone(
        &self,
        messages: &[jetstream::Message],
        p: &Poison,
        now: i64,
    ) -> Result<(), OutboxError> {
        let mut uow = self.outbox.begin().await?;
        insert_dead_letter(uow.tx(), &self.name, &messages[p.idx], p, now).await?;
        uow.commit().await.map(|_| ())
    }

    /// Gives every message of a batch that could not be committed back to the server, to be
    /// redelivered in a second (those already committed are then skipped as duplicates).
    async fn give_back(&self, messages: &[jetstream::Message], e: OutboxError) -> NatsError {
        let naks = messages
            .iter()
            .map(|m| m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))));
        let n = futures_util::future::join_all(naks).await.len();
        metrics::counter!("events_nats_naked_total").increment(n as u64);
        NatsError::Outbox(e)
    }

    /// Decodes one message: CloudEvents structured mode, a known (name, version), a payload
    /// that decodes. Received events are keyed `<aggregate type>@<source>`.
    fn accept(
        &self,
        m: &jetstream::Message,
    ) -> Result<(Box<dyn AnyEnvelope>, RawEnvelope, String, String), Refused> {
        let poison = |reason, msg: String, raw| Refused::Poison(reason, vec![msg], raw);
        if let Some(ct) = m.headers.as_ref().and_then(|h| h.get("Content-Type")) {
            if !ct.as_str().starts_with(CONTENT_TYPE) {
                return Err(poison(
                    DeadLetterReason::Undecodable,
                    format!(
                        "Content-Type {:?} is not {CONTENT_TYPE} (CloudEvents structured mode)",
                        ct.as_str()
                    ),
                    None,
                ));
            }
        }
        let json = std::str::from_utf8(&m.payload).map_err(|e| {
            poison(
                DeadLetterReason::Undecodable,
                format!("the body is not UTF-8: {e}"),
                None,
            )
        })?;
        let raw = RawEnvelope::from_json(json)
            .map_err(|e| Refused::Poison(DeadLetterReason::Undecodable, chain(&e), None))?;
        match self.outbox.dispatcher().registry().decode(&raw) {
            Ok(envelope) => {
                let key = format!("{}@{}", raw.meta.aggregate_type, raw.meta.source);
                Ok((envelope, raw, json.to_owned(), key))
            }
            Err(e) => {
                let reason = match e {
                    DecodeError::UnknownName { .. } | DecodeError::UnknownVersion { .. } => {
                        DeadLetterReason::UnknownEvent
                    }
                    _ => DeadLetterReason::Undecodable,
                };
                Err(Refused::Poison(reason, chain(&e), Some(Box::new(raw))))
            }
        }
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
    /// that long. A failed batch is logged and retried after a second (its messages are
    /// redelivered); the loop never stops on one.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`receive`](Self::receive); prefer `cancel`, which lets the batch in
    /// hand be acked.
    pub async fn run(&self, cancel: CancellationToken, idle: Option<Duration>) -> InboxReport {
        let mut total = InboxReport::default();
        let mut last = Instant::now();
        while !cancel.is_cancelled() {
            match self.receive().await {
                Ok(r) => {
                    if r.received > 0 {
                        last = Instant::now();
                    }
                    total += r;
                }
                Err(e) => {
                    tracing::warn!(error = %event_core::ErrorChain(&e), "inbox batch failed; retrying");
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
        total
    }

    /// Replays this inbox's dead letters `ids`: each is decoded again (a deploy that knows
    /// its type) and committed into the outbox as if just received, marked replayed, with one
    /// audit row, all in one transaction. Ids that are not open dead letters of this inbox
    /// are skipped.
    ///
    /// # Errors
    /// [`NatsError::Replay`] when one still does not decode (nothing is changed);
    /// [`NatsError::Outbox`] or [`NatsError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn replay_dead_letters(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<InboxReport, NatsError> {
        let store = self.outbox.store();
        let now = self.outbox.clock().now_ms();
        let mut uow = self.outbox.begin().await?;
        let mut done = Vec::new();
        for &id in ids {
            let Some(d) = store.dead_letter_by_id(id).await? else {
                continue;
            };
            if d.broker.is_none() || d.handler != self.name || d.resolved_at.is_some() {
                continue;
            }
            let raw = RawEnvelope::from_json(&d.envelope).map_err(|e| NatsError::Replay(id, e))?;
            let envelope = self
                .outbox
                .dispatcher()
                .registry()
                .decode(&raw)
                .map_err(|e| NatsError::Replay(id, e))?;
            let key = format!("{}@{}", raw.meta.aggregate_type, raw.meta.source);
            uow.add_received(envelope, d.envelope.clone(), key);
            uow.tx()
                .execute(
                    "UPDATE event_dead_letters SET resolved_at = $1, resolution = 'replayed'
                     WHERE id = $2 AND resolved_at IS NULL",
                    &[SqlValue::Int(now), SqlValue::Int(id)],
                )
                .await?;
            done.push(id);
        }
        let ids_json = serde_json::to_string(&done).unwrap_or_else(|_| "[]".into());
        uow.tx()
            .execute(
                "INSERT INTO event_audit_log (action, actor, reason, at, dead_letter_ids, count)
                 VALUES ('replay', $1, $2, $3, $4, $5)",
                &[
                    SqlValue::Text(actor),
                    SqlValue::Text(reason),
                    SqlValue::Int(now),
                    SqlValue::Text(&ids_json),
                    SqlValue::Int(done.len() as i64),
                ],
            )
            .await?;
        let r = uow.commit().await?;
        Ok(InboxReport {
            appended: r.appended,
            duplicates: r.duplicates,
            ..InboxReport::default()
        })
    }
}

fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut s = e.source();
    while let Some(c) = s {
        out.push(c.to_string());
        s = c.source();
    }
    out
}

/// Writes a message the inbox cannot accept to the dead letter queue, once per (inbox, event
/// id): a redelivery of a message already dead-lettered (terminated but not confirmed) adds
/// nothing.
async fn insert_dead_letter(
    tx: &mut crate::Tx,
    inbox: &str,
    m: &jetstream::Message,
    p: &Poison,
    now: i64,
) -> Result<(), crate::OutboxError> {
    let (reason, chain, raw) = (&p.reason, &p.chain, &p.raw);
    let info = m.info().ok();
    let broker = BrokerMetadata {
        stream: info.as_ref().map_or("", |i| i.stream).to_owned(),
        stream_sequence: info.as_ref().map_or(0, |i| i.stream_sequence),
        delivery_count: info.as_ref().map_or(1, |i| i.delivered.max(1) as u64),
        subject: m.subject.to_string(),
    };
    let header_id = m
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .and_then(|v| uuid::Uuid::parse_str(v.as_str()).ok());
    let event_id = raw
        .as_ref()
        .map(|r| r.meta.id)
        .or(header_id)
        .unwrap_or_else(|| {
            // No id of its own: one that is the same on every redelivery.
            let h = broker
                .stream
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                });
            uuid::Uuid::from_u64_pair(h, broker.stream_sequence)
        })
        .to_string();
    let body = String::from_utf8_lossy(&m.payload);
    let chain_json = serde_json::to_string(chain).unwrap_or_else(|_| "[]".into());
    let broker_json = serde_json::to_string(&broker).unwrap_or_default();
    let (name, version) = raw
        .as_ref()
        .map_or(("", 0), |r| (r.name.as_str(), i64::from(r.version)));
    let count = tx
        .execute(
            "INSERT INTO event_dead_letters (event_id, handler, name, version, envelope, attempts,
                first_failed_at, last_failed_at, reason, error_chain, dead_at, kind, broker)
             SELECT $1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $7, 'inbox', $10
             WHERE NOT EXISTS (SELECT 1 FROM event_dead_letters
                 WHERE kind = 'inbox' AND handler = $2 AND event_id = $1)",
            &[
                SqlValue::Text(&event_id),
                SqlValue::Text(inbox),
                SqlValue::Text(name),
                SqlValue::Int(version),
                SqlValue::Text(&body),
                SqlValue::Int(broker.delivery_count as i64),
                SqlValue::Int(now),
                SqlValue::Text(reason.as_str()),
                SqlValue::Text(&chain_json),
                SqlValue::Text(&broker_json),
            ],
        )
        .await?;
    if count > 0 {
        metrics::counter!("events_nats_dead_lettered_total").increment(1);
    }
    Ok(())
}
