//! [`Outbox::receive`]: a received batch decoded, committed in one transaction with the dead
//! letters of what cannot be accepted, conflicts isolated, a verdict per message.

use std::collections::HashSet;

use event_core::{AnyEnvelope, DecodeError, RawEnvelope};
use uuid::Uuid;

use super::{InboxReport, Incoming, Receipt, Verdict};
use crate::store::backend::{ChainLink, LinkKind};
use crate::store::{DeadLetterReason, InboxDeadLetter, Place};
use crate::{Outbox, OutboxError, StoreError};

/// The content type of a CloudEvents 1.0 JSON envelope in structured mode.
pub(crate) const CLOUDEVENTS_JSON: &str = "application/cloudevents+json";

/// A message of the batch that decoded: `idx` in the batch, its envelope (taken by a commit),
/// and how it is stored (the JSON as received, keyed `<aggregate type>@<source>`).
pub(super) struct Candidate {
    pub(super) idx: usize,
    pub(super) envelope: Option<Box<dyn AnyEnvelope>>,
    pub(super) raw: RawEnvelope,
    pub(super) json: String,
    pub(super) key: String,
    /// Its place in its aggregate's chain (read once: a bad `prevsequence` is warned once).
    pub(super) link: ChainLink,
}

/// A message of the batch that goes to the dead letter queue, and why.
pub(super) struct Poison {
    pub(super) idx: usize,
    pub(super) reason: DeadLetterReason,
    pub(super) chain: Vec<String>,
    pub(super) raw: Option<Box<RawEnvelope>>,
    /// This consumer registers no event of its name: its dead letter fills its place in the
    /// aggregate's chain instead of holding the events after it.
    pub(super) unknown_name: bool,
}

/// The aggregate key of a received event: its aggregate type and the producer's source, so
/// that it never collides with this service's own aggregates.
pub(super) fn received_key(raw: &RawEnvelope) -> String {
    format!("{}@{}", raw.meta.aggregate_type, raw.meta.source)
}

/// The predecessor a relay named in `raw` (CloudEvents extension attribute `prevsequence`, a
/// string of digits or a number); 0 when it names none, or names it in a form that is not a
/// sequence (never held for it).
pub(super) fn previous_of(raw: &RawEnvelope) -> u64 {
    let Some(value) = raw
        .meta
        .headers
        .get(event_core::PREVIOUS_SEQUENCE_ATTRIBUTE)
    else {
        return 0;
    };
    match value.trim().parse::<u64>() {
        Ok(p) if p < raw.meta.sequence || p == 0 => p,
        _ => {
            // Not a predecessor (garbage, or not before the event): the event cannot be
            // ordered after anything. Said, so that a producer's bug does not pass unseen.
            tracing::warn!(
                event_id = %raw.meta.id,
                aggregate = %format!("{} {}", received_key(raw), raw.meta.aggregate_id),
                sequence = raw.meta.sequence,
                prevsequence = value,
                "a received event's prevsequence is not an earlier sequence of its aggregate; it is released without waiting for a predecessor"
            );
            metrics::counter!("events_inbox_invalid_prevsequence_total").increment(1);
            0
        }
    }
}

/// The place `raw` fills in its aggregate's chain, as `kind`.
pub(super) fn link_of(raw: &RawEnvelope, kind: LinkKind) -> ChainLink {
    ChainLink {
        aggregate_type: received_key(raw),
        aggregate_id: raw.meta.aggregate_id.clone(),
        sequence: raw.meta.sequence,
        previous: previous_of(raw),
        event_id: raw.meta.id,
        kind,
    }
}

/// The place a dead letter fills in its aggregate's chain: none when its body did not
/// decode that far (no aggregate, no sequence).
fn dead_link(p: &Poison) -> Option<ChainLink> {
    // A conflict's place is taken by the stored event, which holds (or not) by its own link.
    if p.reason == DeadLetterReason::Conflict {
        return None;
    }
    let raw = p.raw.as_deref()?;
    // A place the database could not store (U+0000 in its key, refused by PostgreSQL in
    // text; a sequence above i64::MAX) is no place: its aggregate cannot hold events either.
    let storable = !raw.meta.aggregate_id.contains('\0')
        && !raw.meta.aggregate_type.contains('\0')
        && !raw.meta.source.contains('\0')
        && i64::try_from(raw.meta.sequence).is_ok();
    (storable && raw.meta.sequence > 0).then(|| {
        let kind = if p.unknown_name {
            LinkKind::Filler
        } else {
            LinkKind::DeadLetter
        };
        link_of(raw, kind)
    })
}

impl Outbox {
    /// Commits a batch of messages a transport received into this outbox, and says what
    /// became of each: see the [inbox module](crate::inbox) for what is accepted and what is
    /// dead-lettered. `inbox` names the receiving inbox (its dead letters' handler, e.g.
    /// `nats-inbox:billing`); use one name per (transport, consumer) and keep it.
    ///
    /// The batch is committed in one transaction: the accepted events with their
    /// [`Origin`](super::Origin) and their local deliveries, and the dead letters of the messages that
    /// cannot be accepted. Conflicts are looked up in that transaction first; should the
    /// commit still fail on one (another writer took the place meanwhile: PostgreSQL), or on
    /// another refusal of one message, the messages concerned are committed one at a time, in
    /// batch order, each refused one becoming a dead letter in a transaction of its own.
    ///
    /// Returns a [`Receipt`]: one [`Verdict`] per message, in order, and the counts. When the
    /// store fails otherwise (the database is down, an in-transaction handler's transient
    /// error), the messages not committed yet are [`Verdict::Retry`] and
    /// [`Receipt::error`] says why; the rest keep their verdicts.
    ///
    /// # Cancel safety
    /// Cancel safe as far as the broker is concerned: dropped, nothing is settled with it,
    /// and messages whose commit happened are duplicates when redelivered.
    pub async fn receive(&self, inbox: &str, batch: Vec<Incoming>) -> Receipt {
        let mut receipt = Receipt {
            verdicts: vec![Verdict::Retry; batch.len()],
            report: InboxReport {
                received: batch.len(),
                ..InboxReport::default()
            },
            error: None,
            new_dead_letters: 0,
        };
        if batch.is_empty() {
            return receipt;
        }
        self.record_catalog_once().await;
        if let Err(e) = Receiving::new(self, inbox, &batch, &mut receipt)
            .run()
            .await
        {
            receipt.error = Some(e);
        }
        receipt.report.dead_lettered = receipt
            .verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::DeadLettered(_)))
            .count();
        receipt
    }

    /// Decodes one message: the content type (CloudEvents structured mode), the body as a
    /// JSON envelope, a known (name, version), a payload that decodes.
    fn accept(&self, idx: usize, m: &Incoming) -> Result<Candidate, Poison> {
        let poison = |reason, chain: Vec<String>, raw| Poison {
            idx,
            reason,
            chain,
            raw,
            unknown_name: false,
        };
        if let Some(ct) = &m.content_type {
            // A media type's type and subtype are case-insensitive (RFC 9110 §8.3.1); its
            // parameters (`; charset=utf-8`) do not change it.
            let media = ct.split(';').next().unwrap_or_default().trim();
            if !media.eq_ignore_ascii_case(CLOUDEVENTS_JSON) {
                return Err(poison(
                    DeadLetterReason::Undecodable,
                    vec![format!(
                        "Content-Type {ct:?} is not {CLOUDEVENTS_JSON} (CloudEvents structured mode)"
                    )],
                    None,
                ));
            }
        }
        let json = std::str::from_utf8(&m.body).map_err(|e| {
            poison(
                DeadLetterReason::Undecodable,
                vec![format!("the body is not UTF-8: {e}")],
                None,
            )
        })?;
        let raw = RawEnvelope::from_json(json)
            .map_err(|e| poison(DeadLetterReason::Undecodable, chain(&e), None))?;
        if let Err(v) = self.dispatcher().validate(&raw) {
            return Err(poison(
                DeadLetterReason::Invalid,
                chain(&v),
                Some(Box::new(raw)),
            ));
        }
        match self.dispatcher().registry().decode(&raw) {
            Ok(envelope) => {
                let key = received_key(&raw);
                let refusal = self.unstorable(&*envelope, &key, json.len());
                let c = Candidate {
                    idx,
                    envelope: Some(envelope),
                    key,
                    link: link_of(&raw, LinkKind::Event),
                    raw,
                    json: json.to_owned(),
                };
                match refusal {
                    Ok(()) => Ok(c),
                    // The commit would refuse it whatever the rest: set aside now, with the
                    // dead letter the commit's refusal would have written.
                    Err(e) => Err(refused(c, DeadLetterReason::Undecodable, &e)),
                }
            }
            Err(e) => {
                let reason = match e {
                    DecodeError::UnknownName { .. } | DecodeError::UnknownVersion { .. } => {
                        DeadLetterReason::UnknownEvent
                    }
                    _ => DeadLetterReason::Undecodable,
                };
                let unknown_name = matches!(e, DecodeError::UnknownName { .. });
                Err(Poison {
                    unknown_name,
                    ..poison(reason, chain(&e), Some(Box::new(raw)))
                })
            }
        }
    }

    /// The decoded envelope of `c`: the one `accept` decoded, or decoded again (a retried
    /// commit consumed it).
    pub(super) fn envelope_of(&self, c: &mut Candidate) -> Result<Box<dyn AnyEnvelope>, Poison> {
        if let Some(e) = c.envelope.take() {
            return Ok(e);
        }
        self.dispatcher()
            .registry()
            .decode(&c.raw)
            .map_err(|e| Poison {
                idx: c.idx,
                reason: DeadLetterReason::Undecodable,
                chain: chain(&e),
                raw: Some(Box::new(c.raw.clone())),
                unknown_name: false,
            })
    }
}

/// One batch being received.
struct Receiving<'a> {
    outbox: &'a Outbox,
    inbox: &'a str,
    batch: &'a [Incoming],
    receipt: &'a mut Receipt,
    now: i64,
    /// Event ids given `Accepted` so far: a second copy in the batch is a duplicate.
    accepted_ids: HashSet<Uuid>,
}

impl<'a> Receiving<'a> {
    fn new(
        outbox: &'a Outbox,
        inbox: &'a str,
        batch: &'a [Incoming],
        receipt: &'a mut Receipt,
    ) -> Self {
        Receiving {
            outbox,
            inbox,
            batch,
            receipt,
            now: outbox.clock().now_ms(),
            accepted_ids: HashSet::new(),
        }
    }

    async fn run(mut self) -> Result<(), OutboxError> {
        let mut candidates = Vec::new();
        let mut poison = Vec::new();
        for (idx, m) in self.batch.iter().enumerate() {
            match self.outbox.accept(idx, m) {
                Ok(c) => candidates.push(c),
                Err(p) => poison.push(p),
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
        let mut deferred = Vec::new();
        let mut look_up = true;
        loop {
            // Every candidate decoded (a failed round consumed the envelopes).
            for mut c in std::mem::take(&mut candidates) {
                match self.outbox.envelope_of(&mut c) {
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
                    set_aside_late(uow.tx(), &mut candidates, &mut poison).await?;
                }
                // In batch order: the dead letters' ids follow the stream.
                poison.sort_by_key(|p| p.idx);
                let mut written = 0;
                for p in &poison {
                    let d = self.dead_letter(p);
                    written += usize::from(
                        uow.tx()
                            .backend()
                            .insert_inbox_dead_letter(&d, self.now)
                            .await?,
                    );
                }
                // Every place of the batch in its aggregate's chain, before the deliveries
                // are written (those of an event left held are held).
                let links: Vec<ChainLink> = poison
                    .iter()
                    .filter_map(dead_link)
                    .chain(candidates.iter().map(|c| c.link.clone()))
                    .collect();
                uow.tx().backend().link(&links, self.now).await?;
                for c in &mut candidates {
                    let _span =
                        tracing::debug_span!("receive", event_id = %c.raw.meta.id).entered();
                    if let Some(envelope) = c.envelope.take() {
                        let origin = &self.batch[c.idx].origin;
                        uow.add_received(envelope, c.json.clone(), c.key.clone(), Some(origin));
                    }
                }
                uow.commit().await.map(|r| (r, written))
            }
            .await;
            match attempt {
                Ok((r, written)) => {
                    self.receipt.new_dead_letters += written;
                    for p in std::mem::take(&mut poison) {
                        self.receipt.verdicts[p.idx] = Verdict::DeadLettered(p.reason);
                    }
                    for c in std::mem::take(&mut candidates) {
                        self.settle_committed(&c, &r.appended_ids);
                    }
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
                        inbox = self.inbox,
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
                        inbox = self.inbox,
                        error = %event_core::ErrorChain(&e),
                        messages = candidates.len(),
                        "inbox batch refused; committing its messages one at a time"
                    );
                    deferred.append(&mut candidates);
                }
                Err(e) => return Err(e),
            }
        }
        deferred.sort_by_key(|c| c.idx);
        for mut c in deferred {
            let envelope = match self.outbox.envelope_of(&mut c) {
                Ok(e) => e,
                Err(p) => {
                    self.dead_letter_alone(p).await?;
                    continue;
                }
            };
            let attempt = async {
                let mut uow = self.outbox.begin().await?;
                let origin = &self.batch[c.idx].origin;
                uow.tx()
                    .backend()
                    .link(std::slice::from_ref(&c.link), self.now)
                    .await?;
                uow.add_received(envelope, c.json.clone(), c.key.clone(), Some(origin));
                uow.commit().await
            }
            .await;
            match attempt {
                Ok(r) => self.settle_committed(&c, &r.appended_ids),
                Err(e) => {
                    let Some(reason) = refusal(&e) else {
                        return Err(e);
                    };
                    self.dead_letter_alone(refused(c, reason, &e)).await?;
                }
            }
        }
        Ok(())
    }

    /// The verdict of a committed candidate: accepted when the commit appended its event (and
    /// no earlier copy in the batch was), a duplicate otherwise.
    fn settle_committed(&mut self, c: &Candidate, appended: &HashSet<Uuid>) {
        let id = c.raw.meta.id;
        if appended.contains(&id) && self.accepted_ids.insert(id) {
            self.receipt.verdicts[c.idx] = Verdict::Accepted;
            self.receipt.report.appended += 1;
        } else {
            self.receipt.verdicts[c.idx] = Verdict::Duplicate;
            self.receipt.report.duplicates += 1;
        }
    }

    /// Stores one dead letter in a transaction of its own.
    async fn dead_letter_alone(&mut self, p: Poison) -> Result<(), OutboxError> {
        let d = self.dead_letter(&p);
        let mut uow = self.outbox.begin().await?;
        let written = uow
            .tx()
            .backend()
            .insert_inbox_dead_letter(&d, self.now)
            .await?;
        if let Some(link) = dead_link(&p) {
            uow.tx().backend().link(&[link], self.now).await?;
        }
        uow.commit().await?;
        self.receipt.new_dead_letters += usize::from(written);
        self.receipt.verdicts[p.idx] = Verdict::DeadLettered(p.reason);
        Ok(())
    }

    /// The dead letter of `p`: named by its event id — the envelope's, else the broker's
    /// message id, else one derived from its origin, the same on every redelivery — with
    /// every text as PostgreSQL can store it (it refuses U+0000 in `TEXT`; a body that is
    /// not JSON may hold a raw NUL, a name or an error may quote one): otherwise the dead
    /// letter itself would fail and block the batch.
    fn dead_letter(&self, p: &Poison) -> InboxDeadLetter {
        let m = &self.batch[p.idx];
        let event_id = p
            .raw
            .as_ref()
            .map(|r| r.meta.id)
            .or_else(|| {
                m.message_id
                    .as_deref()
                    .and_then(|id| Uuid::parse_str(id).ok())
            })
            .unwrap_or_else(|| derived_id(m));
        let (name, version) = p.raw.as_ref().map_or((String::new(), 0), |r| {
            (r.name.replace('\0', "\u{FFFD}"), r.version)
        });
        // The chain holds no payload value (decode errors and schema violations withhold them).
        tracing::warn!(
            inbox = %self.inbox,
            event_id = %event_id,
            event = %name,
            version,
            reason = %p.reason,
            error = %p.chain.join(": "),
            "a received message is dead-lettered"
        );
        // A body over the envelope limit could never be replayed (the commit refuses it): its
        // first `limit` bytes are kept, so that a few huge messages cannot fill the disk.
        let limit = self.outbox.config().max_envelope_bytes;
        let mut error_chain: Vec<String> = p
            .chain
            .iter()
            .map(|c| crate::outbox::text::storable(c))
            .collect();
        let body = if m.body.len() > limit {
            error_chain.push(format!(
                "the body ({} bytes) is kept truncated to its first {limit} bytes",
                m.body.len()
            ));
            &m.body[..limit]
        } else {
            &m.body[..]
        };
        InboxDeadLetter {
            inbox: self.inbox.to_owned(),
            event_id,
            name,
            version,
            body: String::from_utf8_lossy(body).replace('\0', "\u{FFFD}"),
            reason: p.reason.clone(),
            error_chain,
            origin: m.origin.clone(),
        }
    }
}

/// The namespace of [`derived_id`]'s name-based UUIDs.
const DERIVED_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f0b_1c2e_8a54_4d0e_9b3f_2c71_5e4a_9d10);

/// An id for a message without a readable event id of its own: a name-based UUID (version 5,
/// RFC 9562) of everything that identifies the message and stays the same when the broker
/// redelivers it — the transport, the source, the position, the attributes, the broker's
/// message id, and the body. Two different messages at one position (a transport without
/// positions, a partitioned topic, a stream created anew) get different ids; one message
/// redelivered gets the same.
fn derived_id(m: &Incoming) -> Uuid {
    let o = &m.origin;
    let mut name = Vec::with_capacity(m.body.len() + 128);
    for part in [o.transport.as_bytes(), o.source.as_bytes()] {
        name.extend_from_slice(part);
        name.push(0);
    }
    name.extend_from_slice(&o.position.to_be_bytes());
    for (k, v) in &o.attributes {
        name.extend_from_slice(k.as_bytes());
        name.push(0);
        name.extend_from_slice(v.as_bytes());
        name.push(0);
    }
    if let Some(id) = &m.message_id {
        name.extend_from_slice(id.as_bytes());
    }
    name.push(0);
    name.extend_from_slice(&m.body);
    Uuid::new_v5(&DERIVED_ID_NAMESPACE, &name)
}

pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    event_core::ErrorChain(e).messages()
}

/// The dead-letter reason of a commit error that refuses one message for good (committing it
/// again would fail again, and block the stream), `None` for one worth retrying (the
/// database is down, a transient handler failure).
pub(super) fn refusal(e: &OutboxError) -> Option<DeadLetterReason> {
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

/// The dead letter of a message its commit refused for good (`refusal`): what happened to
/// it, then the error's chain.
fn refused(c: Candidate, reason: DeadLetterReason, error: &OutboxError) -> Poison {
    let m = &c.raw.meta;
    let what = if reason == DeadLetterReason::Conflict {
        format!(
            "event {} conflicts with a stored event: {} {} already has sequence {} under another event id (purge this dead letter if the stored event is the one to keep; a replay commits it once that place is free)",
            m.id, c.key, m.aggregate_id, m.sequence
        )
    } else {
        format!(
            "event {} ({} {} sequence {}) was refused when committed into this outbox; a replay commits it again once the cause is fixed",
            m.id, c.key, m.aggregate_id, m.sequence
        )
    };
    let mut chain = vec![what];
    chain.extend(self::chain(error));
    Poison {
        idx: c.idx,
        reason,
        chain,
        raw: Some(Box::new(c.raw)),
        unknown_name: false,
    }
}

/// Moves the `candidates` whose commit would fail with a conflict (looked up in `tx`, in
/// batch order: see [`Tx::conflicting`](crate::Tx)) to `poison`, as `conflict` dead letters
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

/// Moves the `candidates` whose place in their aggregate's chain an operator skipped (an
/// accepted gap) to `poison`, as `late` dead letters: the events after them were released
/// without them. Replaying such a dead letter delivers it, out of order.
async fn set_aside_late(
    tx: &mut crate::Tx,
    candidates: &mut Vec<Candidate>,
    poison: &mut Vec<Poison>,
) -> Result<(), OutboxError> {
    // The sequenced candidates' places, and which candidate each is.
    let (at, places): (Vec<usize>, Vec<(&str, &str, u64)>) = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.raw.meta.sequence > 0)
        .map(|(n, c)| {
            let m = &c.raw.meta;
            (n, (c.key.as_str(), m.aggregate_id.as_str(), m.sequence))
        })
        .unzip();
    if places.is_empty() {
        return Ok(());
    }
    let late: HashSet<usize> = tx
        .backend()
        .skipped_places(&places)
        .await?
        .into_iter()
        .map(|i| at[i])
        .collect();
    if late.is_empty() {
        return Ok(());
    }
    for (n, c) in std::mem::take(candidates).into_iter().enumerate() {
        if !late.contains(&n) {
            candidates.push(c);
            continue;
        }
        let m = &c.raw.meta;
        let what = format!(
            "event {} ({} {} sequence {}) arrived after an operator accepted the gap it left; the events after it were handled without it (a replay delivers it, out of order)",
            m.id, c.key, m.aggregate_id, m.sequence
        );
        poison.push(Poison {
            idx: c.idx,
            reason: DeadLetterReason::Late,
            chain: vec![what],
            raw: Some(Box::new(c.raw)),
            unknown_name: false,
        });
    }
    Ok(())
}
