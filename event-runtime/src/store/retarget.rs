//! Purging or re-targeting what a destination that no longer exists left in the store (the
//! deliveries and dead letters of a handler replaced by an event union, say), in bounded
//! pages, audited: the [`Store`] side of `events handler purge|retarget`. Knows nothing of
//! which destinations are registered (the [`Outbox`](crate::Outbox) and the tool check that);
//! the SQL is the backend's.

use super::backend::{AuditStamp, DestinationOperation, DestinationPage};
use super::types::DestinationReport;
use super::{now_ms, Store, StoreError, RESOLVE_PAGE};

impl Store {
    /// The names of the events `destination` left undelivered: those of its pending
    /// deliveries and of its open dead letters, sorted. What a handler must take to be the
    /// target of [`retarget_destination`](Self::retarget_destination).
    ///
    /// # Errors
    /// [`StoreError::Database`] when the query fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn undelivered_event_names(
        &self,
        destination: &str,
    ) -> Result<Vec<String>, StoreError> {
        self.inspecting()?
            .undelivered_event_names(destination)
            .await
    }

    /// Gives up on everything `destination` left: its pending deliveries are marked `purged`
    /// and its open dead letters resolved as purged, with one audit row (action
    /// `handler-purge`, `actor`, `reason`, the destination in its selection), in pages of
    /// [`RESOLVE_PAGE`] deliveries, each page its own transaction. Its completed and purged
    /// deliveries stay for retention; inbox dead letters of a consumer of that name are not
    /// touched.
    ///
    /// Call it only for a destination no process delivers to (see
    /// [`Outbox::purge_unregistered`](crate::Outbox::purge_unregistered), which checks that
    /// this outbox has no such destination): a worker that still has it would race the purge.
    /// Returns what was purged and the finished audit row.
    ///
    /// # Errors
    /// [`StoreError::DestinationInUse`] when a delivery of `destination` is leased by a live
    /// worker (checked at the start and by every page: nothing more is changed);
    /// [`StoreError::Database`]: the pages before the failure
    /// stay done and the audit row unfinished; calling it again with the same destination
    /// finishes the operation under the same audit row.
    ///
    /// # Cancel safety
    /// Not cancel safe as one operation: dropped between pages, the pages done stay done and
    /// the audit row unfinished; dropped inside a page, that page rolls back. Calling it again
    /// finishes it.
    pub async fn purge_destination(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
    ) -> Result<DestinationReport, StoreError> {
        let op = DestinationOperation {
            from: destination.to_owned(),
            to: None,
            ordered: false,
        };
        self.run_destination_operation(&op, actor, reason).await
    }

    /// Moves everything `from` left onto the destination `to`, so that `to`'s workers deliver
    /// it and its dead letters can be replayed to `to`: each pending delivery of `from` becomes
    /// one of `to`, at its event's place in its aggregate's run of `to` (when `ordered`, as
    /// `to`'s deliveries are; else a run of its own), due now with its attempts reset; each
    /// dead one moves with its open dead letter, still dead (its run of `to` waits for its
    /// replay or purge, as any dead letter's does). The head of every run of `to` it merged
    /// into is recomputed: one ready delivery, the lowest in sequence. A delivery of `from`
    /// for an event that `to` already has a delivery of (in any status) is a duplicate: it is
    /// purged (with its dead letter), never delivered twice, and counted in
    /// [`DestinationReport::duplicates`].
    ///
    /// One audit row (action `handler-retarget`, `actor`, `reason`, both destinations in its
    /// selection), in pages of [`RESOLVE_PAGE`] deliveries, each page its own transaction.
    ///
    /// Order: `to`'s deliveries that were completed before the move are not repeated, so an
    /// aggregate whose later events `to` has handled already receives the moved earlier ones
    /// after them; a delivery of `to` that a worker is delivering while the move runs goes
    /// on. Re-target before `to`'s workers deliver the aggregates concerned (right after the
    /// deploy that added it), or pause `to` meanwhile
    /// ([`pause_destination`](Self::pause_destination)).
    ///
    /// Call it only for a `from` no process delivers to and a `to` that one does (see
    /// [`Outbox::retarget_unregistered`](crate::Outbox::retarget_unregistered), which checks
    /// both and knows whether `to` is ordered).
    ///
    /// # Errors
    /// [`StoreError::SameDestination`] when `from` is `to`, [`StoreError::DestinationInUse`]
    /// when a delivery of `from` is leased by a live worker (checked at the start and by
    /// every page: nothing more is changed then);
    /// [`StoreError::Database`]: the pages before the failure stay done and the audit row
    /// unfinished; calling it again with the same arguments finishes it under the same row.
    ///
    /// # Cancel safety
    /// As [`purge_destination`](Self::purge_destination).
    pub async fn retarget_destination(
        &self,
        from: &str,
        to: &str,
        ordered: bool,
        actor: &str,
        reason: &str,
    ) -> Result<DestinationReport, StoreError> {
        let op = DestinationOperation {
            from: from.to_owned(),
            to: Some(to.to_owned()),
            ordered,
        };
        self.run_destination_operation(&op, actor, reason).await
    }

    async fn run_destination_operation(
        &self,
        op: &DestinationOperation,
        actor: &str,
        reason: &str,
    ) -> Result<DestinationReport, StoreError> {
        let operations = self.operating()?;
        // Checked before the first write: it finishes the operation.
        let log = self.logging()?;
        let entry = operations
            .start_destination_operation(op, &AuditStamp::now(actor, reason))
            .await?;
        let mut total = DestinationPage::default();
        loop {
            let page = operations
                .destination_page(entry.id, op, RESOLVE_PAGE, now_ms())
                .await?;
            if page.selected == 0 {
                break;
            }
            total.deliveries += page.deliveries;
            total.dead_letters += page.dead_letters;
            total.duplicates += page.duplicates;
        }
        let audit = log.finish_operation(entry.id, now_ms()).await?;
        Ok(DestinationReport {
            audit,
            deliveries: total.deliveries,
            dead_letters: total.dead_letters,
            duplicates: total.duplicates,
        })
    }
}
