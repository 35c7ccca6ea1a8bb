//! Gaps in received aggregates' chains: found after
//! [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after), reported, listed, and
//! accepted by an operator.

use crate::store::backend::Gap;
use crate::store::GapAcceptance;
use crate::{Outbox, OutboxError};

/// Gaps opened per call of [`Outbox::detect_gaps`] at most; the next call finds the rest.
const DETECT_LIMIT: usize = 1_000;

impl Outbox {
    /// Opens a gap for every received event that has waited longer than
    /// [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after) for a predecessor that did
    /// not arrive (or arrived and was dead-lettered here), and reports each once: a warning
    /// naming the aggregate, the missing sequence (earlier ones may be missing too), whether
    /// it is dead-lettered here, the waiting event and where it came from, and the counter
    /// `events_inbox_gaps_opened_total`. The delivery workers' upkeep calls it every 30 s;
    /// returns the gaps it opened (at most 1,000 per call).
    ///
    /// A gap is never skipped by itself: the events after it wait until the missing event
    /// arrives (the gap closes, recorded as `arrived`), its dead letter is replayed (or
    /// purged, which accepts the gap), or an operator accepts it
    /// ([`accept_gaps`](Self::accept_gaps), `events inbox gaps accept`).
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails.
    ///
    /// # Cancel safety
    /// Cancel safe: the gaps are opened in one transaction.
    pub async fn detect_gaps(&self) -> Result<Vec<Gap>, OutboxError> {
        let now = self.clock().now_ms();
        let wait = i64::try_from(self.config().gap_after.as_millis()).unwrap_or(i64::MAX);
        let store = self.store().backend();
        let opened = store
            .open_gaps(now.saturating_sub(wait), now, DETECT_LIMIT)
            .await?;
        for g in &opened {
            let origin = store
                .received_origin(g.waiting_event_id)
                .await
                .ok()
                .flatten();
            let (dead_here, what) = if g.dead_letter_id.is_some() {
                (
                    " (it is dead-lettered here)",
                    "replay its dead letter, or purge it to accept the gap",
                )
            } else if origin.as_ref().is_some_and(|o| o.transport == "rabbitmq") {
                (
                    "",
                    "a RabbitMQ queue keeps nothing it delivered, so it cannot be re-fetched: re-publish it from the producer with `events relay republish`, or `events inbox gaps accept`",
                )
            } else {
                (
                    "",
                    "re-fetch it with `events inbox gaps refetch`; if the broker lost it, re-publish it from the producer with `events relay republish`; or `events inbox gaps accept`",
                )
            };
            tracing::warn!(
                gap = g.id,
                source = origin.as_ref().map(|o| o.source.as_str()).unwrap_or(""),
                aggregate = %format!("{} {}", g.aggregate_type, g.aggregate_id),
                missing_sequence = g.missing_sequence,
                dead_letter = ?g.dead_letter_id,
                waiting_sequence = g.waiting_sequence,
                waiting_event_id = %g.waiting_event_id,
                waiting_for_s = (now - g.waiting_since) / 1000,
                "gap: a received event waits for a predecessor that did not arrive{}; the events after it are held ({})",
                dead_here, what
            );
            metrics::counter!("events_inbox_gaps_opened_total").increment(1);
        }
        Ok(opened)
    }

    /// Received events held now: stored, waiting for a predecessor in their aggregate's chain
    /// (their handlers have not run). Held longer than
    /// [`gap_after`](crate::OutboxConfig::gap_after), each is behind a [`Gap`].
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn held_events(&self) -> Result<u64, OutboxError> {
        Ok(self.store().backend().held_events().await?)
    }

    /// The gaps: see [`Store::gaps`](crate::Store::gaps).
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn gaps(&self, include_closed: bool) -> Result<Vec<Gap>, OutboxError> {
        Ok(self.store().gaps(include_closed).await?)
    }

    /// Accepts open gaps and wakes this process's workers for what it released: see
    /// [`Store::accept_gaps`](crate::Store::accept_gaps).
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails (the pages committed stay accepted).
    ///
    /// # Cancel safety
    /// Cancel safe: each page commits or not as a whole.
    pub async fn accept_gaps(
        &self,
        ids: Option<&[i64]>,
        actor: &str,
        reason: &str,
    ) -> Result<GapAcceptance, OutboxError> {
        let done = self.store().accept_gaps(ids, actor, reason).await?;
        self.inner.wake.notify_waiters();
        Ok(done)
    }
}
