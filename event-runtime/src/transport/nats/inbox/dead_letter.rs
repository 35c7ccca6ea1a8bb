//! What the inbox cannot accept: the messages of a batch, the dead letters of those it
//! refuses (with their broker metadata), and replaying them after a deploy that knows them.

use async_nats::jetstream;
use event_core::{AnyEnvelope, RawEnvelope};

use super::super::NatsError;
use super::{InboxReport, NatsInbox};
use crate::store::{BrokerMetadata, DeadLetterReason};
use crate::{OutboxError, SqlValue, StoreError};

pub(super) enum Refused {
    Poison(DeadLetterReason, Vec<String>, Option<Box<RawEnvelope>>),
}

/// A message of the batch that decoded: `idx` in the batch, its envelope (taken by a commit),
/// and how it is stored (the JSON as received, keyed `<aggregate type>@<source>`).
pub(super) struct Candidate {
    pub(super) idx: usize,
    pub(super) envelope: Option<Box<dyn AnyEnvelope>>,
    pub(super) raw: RawEnvelope,
    pub(super) json: String,
    pub(super) key: String,
}

/// A message of the batch that goes to the dead letter queue, and why.
pub(super) struct Poison {
    pub(super) idx: usize,
    pub(super) reason: DeadLetterReason,
    pub(super) chain: Vec<String>,
    pub(super) raw: Option<Box<RawEnvelope>>,
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
pub(super) fn refused(c: Candidate, reason: DeadLetterReason, error: &OutboxError) -> Poison {
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
    }
}

impl NatsInbox {
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

pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    event_core::ErrorChain(e).messages()
}

/// Writes a message the inbox cannot accept to the dead letter queue, once per (inbox, event
/// id): a redelivery of a message already dead-lettered (terminated but not confirmed) adds
/// nothing.
pub(super) async fn insert_dead_letter(
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
    // Every text as PostgreSQL can store it (it refuses U+0000 in `TEXT`): a body that is not
    // JSON may hold a raw NUL, a name or an error may quote one. Otherwise the dead letter
    // itself would fail and block the batch.
    let body = String::from_utf8_lossy(&m.payload).replace('\0', "\u{FFFD}");
    let chain: Vec<String> = chain
        .iter()
        .map(|c| crate::outbox::text::storable(c))
        .collect();
    let chain_json = serde_json::to_string(&chain).unwrap_or_else(|_| "[]".into());
    let broker_json = serde_json::to_string(&broker).unwrap_or_default();
    let (name, version) = raw.as_ref().map_or((String::new(), 0), |r| {
        (r.name.replace('\0', "\u{FFFD}"), i64::from(r.version))
    });
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
                SqlValue::Text(&name),
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
