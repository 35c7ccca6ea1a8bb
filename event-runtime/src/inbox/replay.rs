//! Replaying an inbox's dead letters through the core: decoded again by this service's
//! registry and committed as if just received. Needs no broker connection.

use event_core::RawEnvelope;

use super::receive::{link_of, received_key};
use super::InboxReport;
use crate::store::backend::{AuditStamp, LinkKind};
use crate::{Outbox, OutboxError};

impl Outbox {
    /// Replays the inbox dead letters `ids` (written by [`Outbox::receive`], whatever the
    /// transport): each is decoded again — after a deploy that knows its event type or
    /// version — and committed into this outbox as if just received (same event id, its
    /// stored [`Origin`](super::Origin), deliveries to local handlers), marked `replayed`, with
    /// one audit row (action `replay`, `actor`, `reason`, the ids replayed), all in one
    /// transaction. Ids that are not open inbox dead letters (a delivery's dead letter, a
    /// resolved one, an unknown id) are skipped: replay a delivery's dead letter with
    /// [`Store::resolve_dead_letters`](crate::Store::resolve_dead_letters). When none is
    /// replayed, nothing is written (no audit row).
    ///
    /// An event id the outbox holds already is a duplicate (counted, nothing written); a
    /// conflict (the dead letter's place in its aggregate is still taken by another event)
    /// fails the replay.
    ///
    /// Returns the counts: `received`, the dead letters replayed (fewer than `ids` when some
    /// were skipped); `appended`, their events committed; `duplicates`, those whose event id
    /// the outbox held already.
    ///
    /// # Errors
    /// [`OutboxError::NotReplayable`] naming the first dead letter that still does not decode;
    /// [`OutboxError::NotValid`] for one that still breaks its JSON Schema (with schema
    /// validation on);
    /// [`OutboxError::Store`] — [`StoreError::Conflict`](crate::StoreError::Conflict) when an
    /// event's (aggregate, sequence) is still taken, or the database failed;
    /// [`OutboxError::Aborted`] when an in-transaction handler refused an event. Nothing is
    /// replayed then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn replay_inbox_dead_letters(
        &self,
        ids: &[i64],
        actor: &str,
        reason: &str,
    ) -> Result<InboxReport, OutboxError> {
        self.replay_received(ids, None, actor, reason).await
    }

    /// [`replay_inbox_dead_letters`](Self::replay_inbox_dead_letters) of the dead letters of
    /// `inbox` only, when given.
    pub(crate) async fn replay_received(
        &self,
        ids: &[i64],
        inbox: Option<&str>,
        actor: &str,
        reason: &str,
    ) -> Result<InboxReport, OutboxError> {
        let stamp = AuditStamp {
            actor,
            reason,
            at: self.clock().now_ms(),
        };
        let mut uow = self.begin().await?;
        let taken = uow
            .tx()
            .backend()
            .take_inbox_dead_letters(ids, inbox, &stamp)
            .await?
            .letters;
        let taken_count = taken.len();
        let mut links = Vec::with_capacity(taken_count);
        for d in taken {
            let not_replayable = |source| OutboxError::NotReplayable {
                dead_letter: d.id,
                source,
            };
            let raw = RawEnvelope::from_json(&d.body).map_err(not_replayable)?;
            self.dispatcher()
                .validate(&raw)
                .map_err(|source| OutboxError::NotValid {
                    dead_letter: d.id,
                    source,
                })?;
            let envelope = self
                .dispatcher()
                .registry()
                .decode(&raw)
                .map_err(not_replayable)?;
            let key = received_key(&raw);
            // Its place in the aggregate's chain: a dead letter's place is taken (the events
            // it held are released after it), a skipped one (late) is released at once.
            links.push(link_of(&raw, LinkKind::Event));
            uow.add_received(envelope, d.body, key, d.origin.as_ref());
        }
        uow.tx().backend().link(&links, stamp.at).await?;
        let replayed = taken_count;
        let r = uow.commit().await?;
        Ok(InboxReport {
            received: replayed,
            appended: r.appended,
            duplicates: r.duplicates,
            ..InboxReport::default()
        })
    }
}
