//! Re-publishing events a relay published already, for the one recovery left after a broker
//! lost its data: the [`Store`] side of `events relay republish`. Knows nothing of brokers:
//! the relay publishes what this makes pending again; the SQL is the backend's.

use super::backend::RepublishSelection;
use super::types::AuditEntry;
use super::{now_ms, Store, StoreError, RESOLVE_PAGE};
use crate::store::backend::AuditStamp;

/// What [`Store::republish`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RepublishReport {
    /// The audit row (action `relay-republish`, its selection, its count the deliveries made
    /// pending again), finished.
    pub audit: AuditEntry,
    /// Deliveries made pending again by this call (an interrupted call's earlier pages are
    /// in [`audit`](Self::audit)'s count).
    pub republished: u64,
    /// Selected events whose delivery to the destination was pending: published anyway.
    pub pending: u64,
    /// Selected events whose delivery is dead-lettered: not touched (replay their dead
    /// letters, `events dlq replay`).
    pub dead: u64,
}

impl Store {
    /// Publishes again, with the same event ids, the events of `selection` that the relay
    /// `selection.destination` published already and this store still holds (their delivery
    /// completed and was not purged by retention): each such delivery is made pending again
    /// (attempts reset, due now) and joins its aggregate's run in sequence order, so the
    /// relay publishes them in order, each naming as its predecessor (`prevsequence`) the
    /// event of its aggregate published before it. What a consumer holds already is absorbed
    /// there — by the stream's duplicate window (`Nats-Msg-Id` is the event id) or by the
    /// inbox's event-id de-duplication — so re-publishing more than was lost is harmless.
    ///
    /// The recovery after a broker lost its data (a wiped JetStream store): a consumer that
    /// was behind reports gaps that a re-fetch from the stream cannot close. Pending
    /// deliveries are left as they are (counted in [`RepublishReport::pending`]), and dead
    /// ones too ([`RepublishReport::dead`]: replay their dead letters).
    ///
    /// Audited: one row (action `relay-republish`, `actor`, `reason`, the selection as JSON),
    /// its count the deliveries made pending again, done in pages of [`RESOLVE_PAGE`] events,
    /// each its own transaction. Interrupted, the pages done stay done and the row stays
    /// unfinished; calling it again with the same selection continues under the same row
    /// (an event it re-published and the relay published since is not selected again).
    ///
    /// # Errors
    /// [`StoreError::InvalidSelection`] when `selection` names neither aggregates nor a time,
    /// or its destination is not named as a relay (`TRANSPORT:…`: a handler's deliveries are
    /// run again by replaying their dead letters, never re-published) (nothing is changed);
    /// [`StoreError::Database`] when the database fails (the pages before stay done).
    ///
    /// # Cancel safety
    /// Not cancel safe as one operation: dropped between pages, the pages done stay done and
    /// the audit row unfinished; calling it again finishes it.
    pub async fn republish(
        &self,
        selection: &RepublishSelection,
        actor: &str,
        reason: &str,
    ) -> Result<RepublishReport, StoreError> {
        if !crate::outbox::destination::relay_name(&selection.destination) {
            return Err(StoreError::InvalidSelection(format!(
                "`{}` is not named as a relay (`TRANSPORT:…`, such as `nats:<stream>`): only a relay's deliveries are published again",
                selection.destination
            )));
        }
        let operations = self.operating()?;
        // Checked before the first write: it finishes the operation.
        let log = self.logging()?;
        let start = operations
            .start_republish(selection, &AuditStamp::now(actor, reason))
            .await?;
        let started = start.audit.at.timestamp_millis();
        let mut after = String::new();
        let mut republished = 0;
        loop {
            let page = operations
                .republish_page(
                    start.audit.id,
                    selection,
                    started,
                    &after,
                    RESOLVE_PAGE,
                    now_ms(),
                )
                .await?;
            republished += page.republished;
            match page.last {
                Some(last) => after = last,
                None => break,
            }
        }
        let audit = log.finish_operation(start.audit.id, now_ms()).await?;
        Ok(RepublishReport {
            audit,
            republished,
            pending: start.pending,
            dead: start.dead,
        })
    }
}
