//! The inbox: a durable pull consumer whose fetched batches are decoded through the registry
//! and committed once into this service's outbox (de-duplicated by event id), then
//! acknowledged. It must not run handlers: the consuming outbox's engine does.

mod config;
mod dead_letter;
mod identity;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, AckKind};
use event_core::{AnyEnvelope, DecodeError, RawEnvelope};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

pub use config::{InboxConfig, InboxReport, ReceivedBatch};
use dead_letter::{chain, insert_dead_letter, refusal, refused, Candidate, Poison, Refused};
pub(crate) use identity::observe;
use identity::{created, describe_observed, same_time};

use super::{NatsError, CONTENT_TYPE};
use crate::store::{DeadLetterReason, Place};
use crate::{InboxIdentity, Outbox, OutboxError, StoreError};

/// How often, at least, the inbox compares the broker's stream and consumer with the
/// identity it recorded (also after every failed fetch).
pub const IDENTITY_CHECK_INTERVAL: Duration = Duration::from_secs(30);

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
    /// [`NatsError::Config`]; [`NatsError::RetentionTooShort`];
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
        config.validate()?;
        let horizon = config.redelivery_horizon();
        let retention = outbox.config().retention;
        if retention <= horizon {
            return Err(NatsError::RetentionTooShort { retention, horizon });
        }
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
        let inbox = NatsInbox {
            name,
            outbox,
            js: js.clone(),
            consumer,
            config,
            identity,
            verified: Mutex::new(Instant::now()),
            seen: Mutex::new(0),
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
                    self.verdict().await?;
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

    async fn fetch(&self) -> Result<Vec<jetstream::Message>, NatsError> {
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
        Ok(messages)
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
        // The batch is committed at once, in one transaction: the first round looks up, in
        // that transaction, which messages conflict (an (aggregate, sequence) the outbox holds
        // under another event id, or that an earlier message of the batch claims) and writes
        // their dead letters with the rest. One transaction per conflicting message would
        // each wait for the write lock that the outbox's workers take too (SQLite: a batch of
        // 256 conflicts took minutes). Should a conflict still fail the commit (another
        // writer took the place after the look-up: PostgreSQL), the messages of the aggregate
        // it names are taken out and committed one at a time, in order, after the rest; a
        // conflict naming no message takes them all out. Each round takes one message out
        // at least.
        let mut accepted = Vec::new();
        let mut deferred = Vec::new();
        let mut look_up = true;
        loop {
            // Every candidate decoded (a failed round consumed the envelopes).
            for mut c in std::mem::take(&mut candidates) {
                match self.envelope(&mut c) {
                    Ok(e) => {
                        c.envelope = Some(e);
                        candidates.push(c);
                    }
                    Err(p) => poison.push(p),
                }
            }
            let attempt = async {
                let mut uow = self.outbox.begin().await?;
                if std::mem::take(&mut look_up) {
                    set_aside_conflicts(uow.tx(), &mut candidates, &mut poison).await?;
                }
                for p in &poison {
                    insert_dead_letter(uow.tx(), &self.name, &messages[p.idx], p, now).await?;
                }
                for c in &mut candidates {
                    let _span =
                        tracing::debug_span!("receive", event_id = %c.raw.meta.id).entered();
                    if let Some(envelope) = c.envelope.take() {
                        uow.add_received(envelope, c.json.clone(), c.key.clone());
                    }
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
                Err(e) => {
                    let Some(reason) = refusal(&e) else {
                        return Err(self.give_back(&messages, e).await);
                    };
                    let p = refused(c, reason, &e);
                    if let Err(e) = self.dead_letter_alone(&messages, &p, now).await {
                        return Err(self.give_back(&messages, e).await);
                    }
                    poison.push(p);
                }
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
    /// redelivered); the loop stops only on a verdict about the broker's data.
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
        while !cancel.is_cancelled() {
            match self.receive().await {
                Ok(r) => {
                    if r.received > 0 {
                        last = Instant::now();
                    }
                    total += r;
                }
                Err(e) if e.is_fatal() => {
                    tracing::error!(inbox = %self.name, error = %event_core::ErrorChain(&e), "inbox stopped");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(inbox = %self.name, error = %event_core::ErrorChain(&e), "inbox batch failed; retrying");
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

/// Moves the `candidates` whose commit would fail with a conflict (looked up in `tx`, in
/// stream order: see [`Tx::conflicting`](crate::Tx)) to `poison`, as `conflict` dead letters
/// saying what the commit would have said.
async fn set_aside_conflicts(
    tx: &mut crate::Tx,
    candidates: &mut Vec<Candidate>,
    poison: &mut Vec<Poison>,
) -> Result<(), OutboxError> {
    let places: Vec<Place<'_>> = candidates
        .iter()
        .map(|c| Place {
            aggregate_type: &c.key,
            aggregate_id: &c.raw.meta.aggregate_id,
            sequence: c.raw.meta.sequence,
            event_id: c.raw.meta.id,
        })
        .collect();
    let conflicting = tx.conflicting(&places).await?;
    if conflicting.is_empty() {
        return Ok(());
    }
    let mut conflicting = conflicting.into_iter().peekable();
    for (i, c) in std::mem::take(candidates).into_iter().enumerate() {
        if conflicting.next_if_eq(&i).is_none() {
            candidates.push(c);
            continue;
        }
        let e = OutboxError::Store(StoreError::Conflict {
            aggregate_type: c.key.clone(),
            aggregate_id: c.raw.meta.aggregate_id.clone(),
            sequence: c.raw.meta.sequence,
        });
        poison.push(refused(c, DeadLetterReason::Conflict, &e));
    }
    Ok(())
}
