//! Deliveries and dead letters of destinations this outbox does not have: what a deploy that
//! renamed or replaced handlers (by an event union, say) leaves in the store. Reports them;
//! never claims, purges or re-targets anything.

use crate::store::HandlerStats;
use event_core::ErrorChain;

use super::{Outbox, OutboxError};

impl Outbox {
    /// The destinations with pending deliveries or open dead letters in the store that this
    /// outbox has no handler or destination for, with their counts, by name. Nothing in this
    /// process claims them: either another process has that handler, or they were left by
    /// handlers that no longer exist and wait for a handler of that name (dead letters can be
    /// purged with `events dlq purge --handler`). Spawned workers log them once at start-up.
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

    /// Logs [`unregistered_destinations`](Self::unregistered_destinations), one warning each.
    pub(crate) async fn report_unregistered(&self) {
        match self.unregistered_destinations().await {
            Ok(left) => {
                for h in left {
                    tracing::warn!(
                        handler = %h.handler,
                        pending = h.pending,
                        dead_letters = h.dead,
                        "deliveries of a handler this process does not register: unless another process has it, nothing delivers them (a renamed or replaced handler?); register a handler of that name, and purge its dead letters with `events dlq purge --handler`"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "listing deliveries of unregistered handlers failed")
            }
        }
    }
}
