//! Deliveries and dead letters of destinations this outbox does not have: what a deploy that
//! renamed or replaced handlers (by an event union, say) leaves in the store. Reports them,
//! and purges or re-targets them on request after checking the destinations against this
//! outbox's own; never claims anything.

use crate::store::{DestinationReport, HandlerStats};
use event_core::ErrorChain;

use super::destination::relay_name;
use super::{Outbox, OutboxError};

impl Outbox {
    /// The destinations with pending deliveries or open dead letters in the store that this
    /// outbox has no handler or destination for, with their counts, by name. Nothing in this
    /// process claims them: either another process has that handler, or they were left by
    /// handlers that no longer exist and wait for a handler of that name (dead letters can be
    /// purged or re-targeted with [`purge_unregistered`](Self::purge_unregistered) /
    /// [`retarget_unregistered`](Self::retarget_unregistered), `events handler
    /// purge|retarget`). Spawned workers log them once at start-up.
    ///
    /// # Errors
    /// [`OutboxError::Store`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn unregistered_destinations(&self) -> Result<Vec<HandlerStats>, OutboxError> {
        let stats = self.inner.store.stats().await?;
        let mut left: Vec<HandlerStats> = stats
            .handlers
            .into_iter()
            .filter(|h| h.pending + h.dead > 0)
            .filter(|h| self.inner.claimable.binary_search(&h.handler).is_err())
            .collect();
        left.sort_by(|a, b| a.handler.cmp(&b.handler));
        Ok(left)
    }

    /// Gives up on the pending deliveries and open dead letters of `destination`, a
    /// destination this outbox does not have (a handler removed or replaced by a deploy), with
    /// one audit row: [`Store::purge_destination`](crate::Store::purge_destination), which
    /// says what it does and how it pages.
    ///
    /// # Errors
    /// [`OutboxError::Registered`] when `destination` is one of this outbox's
    /// [`destinations`](Self::destinations) (nothing is changed);
    /// [`OutboxError::Store`] with [`StoreError::DestinationInUse`](crate::StoreError::DestinationInUse)
    /// when another process's live worker holds one of its deliveries (nothing is changed),
    /// or a database error (the pages done stay done; call it again to finish).
    ///
    /// # Cancel safety
    /// As [`Store::purge_destination`](crate::Store::purge_destination): dropped part-way, the
    /// pages done stay done, audited; calling it again finishes it.
    pub async fn purge_unregistered(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
    ) -> Result<DestinationReport, OutboxError> {
        self.refuse_registered(destination)?;
        Ok(self
            .inner
            .store
            .purge_destination(destination, actor, reason)
            .await?)
    }

    /// Moves the pending deliveries and open dead letters of `from`, a destination this outbox
    /// does not have, onto `to`, one it has (the event union that replaced `from`, say), with
    /// one audit row: [`Store::retarget_destination`](crate::Store::retarget_destination),
    /// which says how they merge into `to`'s runs per aggregate and how duplicates (events
    /// `to` already has a delivery of) are dropped. Whether the moved deliveries keep
    /// per-aggregate order is `to`'s own setting.
    ///
    /// # Errors
    /// [`OutboxError::Registered`] when `from` is one of this outbox's
    /// [`destinations`](Self::destinations), [`OutboxError::NotRegistered`] when `to` is not,
    /// [`OutboxError::TakesOtherEvents`] when `from` left events `to` does not take (nothing
    /// is changed); [`OutboxError::Store`] with
    /// [`StoreError::DestinationInUse`](crate::StoreError::DestinationInUse) when another
    /// process's live worker holds a delivery of `from` (nothing is changed), or a database
    /// error (the pages done stay done; call it again to finish).
    ///
    /// # Cancel safety
    /// As [`purge_unregistered`](Self::purge_unregistered).
    pub async fn retarget_unregistered(
        &self,
        from: &str,
        to: &str,
        actor: &str,
        reason: &str,
    ) -> Result<DestinationReport, OutboxError> {
        self.refuse_registered(from)?;
        if self
            .inner
            .claimable
            .binary_search_by(|d| d.as_str().cmp(to))
            .is_err()
        {
            return Err(OutboxError::NotRegistered {
                destination: to.to_owned(),
                known: self.inner.claimable.join(", "),
            });
        }
        // Every event left must be one `to` takes, or the moved deliveries would only be
        // dead-lettered there ("does not take … events"), with no way back.
        let takes: std::collections::BTreeSet<&str> = self
            .inner
            .dispatcher
            .registry()
            .events()
            .iter()
            .filter(|e| {
                self.inner
                    .routes
                    .get(&(e.type_id)())
                    .is_some_and(|r| r.iter().any(|r| r.destination == to))
            })
            .map(|e| e.name)
            .collect();
        let left = self.inner.store.undelivered_event_names(from).await?;
        let others: Vec<&str> = left
            .iter()
            .map(String::as_str)
            .filter(|n| !takes.contains(n))
            .collect();
        if !others.is_empty() {
            return Err(OutboxError::TakesOtherEvents {
                destination: to.to_owned(),
                events: others.join(", "),
            });
        }
        // A destination is ordered when it orders the events it receives (a transport's
        // relay says so per event type).
        let ordered = self
            .inner
            .routes
            .values()
            .flatten()
            .any(|r| r.destination == to && r.ordered);
        Ok(self
            .inner
            .store
            .retarget_destination(from, to, ordered, actor, reason)
            .await?)
    }

    fn refuse_registered(&self, destination: &str) -> Result<(), OutboxError> {
        if self
            .inner
            .claimable
            .binary_search_by(|d| d.as_str().cmp(destination))
            .is_ok()
        {
            return Err(OutboxError::Registered {
                destination: destination.to_owned(),
            });
        }
        Ok(())
    }

    /// Logs [`unregistered_destinations`](Self::unregistered_destinations), one warning each.
    pub(crate) async fn report_unregistered(&self) {
        match self.unregistered_destinations().await {
            Ok(left) => {
                for h in left {
                    if relay_name(&h.handler) {
                        tracing::warn!(
                            destination = %h.handler,
                            pending = h.pending,
                            dead_letters = h.dead,
                            "unpublished events of a transport's relay this process does not have: they wait for a process that runs with that transport configured (configure it here to publish them); they are not a removed handler's, so do not purge them"
                        );
                        continue;
                    }
                    tracing::warn!(
                        handler = %h.handler,
                        pending = h.pending,
                        dead_letters = h.dead,
                        "deliveries of a handler this process does not register: unless another process has it, nothing delivers them (a renamed or replaced handler?); register a handler of that name, or purge or re-target what it left with `events handler purge|retarget`"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "listing deliveries of unregistered handlers failed")
            }
        }
    }
}
