//! Gaps in received aggregates' chains: found after
//! [`OutboxConfig::gap_after`](crate::OutboxConfig::gap_after), reported, listed, and
//! accepted by an operator.

use crate::store::backend::Gap;
use crate::store::AuditEntry;
use crate::{Outbox, OutboxError};

/// Gaps opened per call of [`Outbox::detect_gaps`] at most; the next call finds the rest.
const DETECT_LIMIT: usize = 1_000;

/// Gaps accepted per transaction by [`Outbox::accept_gaps`].
const ACCEPT_PAGE: usize = 200;

/// What [`Outbox::accept_gaps`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GapAcceptance {
    /// The audit row (action `gap-accept`), finished, its count the gaps accepted.
    pub audit: AuditEntry,
    /// The gaps accepted, in id order (one that closed meanwhile is left out).
    pub accepted: Vec<Gap>,
}

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
            tracing::warn!(
                gap = g.id,
                source = origin.as_ref().map(|o| o.source.as_str()).unwrap_or(""),
                aggregate = %format!("{} {}", g.aggregate_type, g.aggregate_id),
                missing_sequence = g.missing_sequence,
                dead_letter = ?g.dead_letter_id,
                waiting_sequence = g.waiting_sequence,
                waiting_event_id = %g.waiting_event_id,
                waiting_for_s = (now - g.waiting_since) / 1000,
                "gap: a received event waits for a predecessor that did not arrive{}; the events after it are held (replay its dead letter, or `events inbox gaps accept`)",
                if g.dead_letter_id.is_some() { " (it is dead-lettered here)" } else { "" }
            );
            metrics::counter!("events_inbox_gaps_opened_total").increment(1);
        }
        Ok(opened)
    }

    /// The gaps, in id order: the open ones, or every one (closed ones with how they closed)
    /// with `include_closed`.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn gaps(&self, include_closed: bool) -> Result<Vec<Gap>, OutboxError> {
        let store = self.store().backend();
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = store.gaps(include_closed, after, 1_000).await?;
            let done = page.len() < 1_000;
            after = page.last().map_or(after, |g| g.id);
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// Accepts open gaps — `ids`, or every open gap with `None` — as the operator `actor`
    /// with `reason`: each missing place is skipped and the events held after it are
    /// released to their handlers in chain order. A missing event that arrives afterwards
    /// is dead-lettered as `late`. Audited (action `gap-accept`, one row for the operation,
    /// its count the gaps accepted); done in pages of 200 gaps, one transaction each, so an
    /// interrupted call leaves the rest open and calling it again accepts them.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails (the pages committed stay accepted).
    ///
    /// # Cancel safety
    /// Cancel safe: each page commits or not as a whole; the audit row stays unfinished.
    pub async fn accept_gaps(
        &self,
        ids: Option<&[i64]>,
        actor: &str,
        reason: &str,
    ) -> Result<GapAcceptance, OutboxError> {
        let store = self.store().backend();
        let selection = serde_json::json!({ "gaps": ids }).to_string();
        let now = self.clock().now_ms();
        let audit = store
            .start_audit("gap-accept", actor, reason, Some(&selection), now)
            .await?;
        let wanted: Vec<i64> = match ids {
            Some(ids) => ids.to_vec(),
            None => self.gaps(false).await?.iter().map(|g| g.id).collect(),
        };
        let mut accepted = Vec::new();
        for page in wanted.chunks(ACCEPT_PAGE) {
            let now = self.clock().now_ms();
            accepted.extend(store.accept_gaps(page, audit.id, now).await?);
        }
        let audit = store
            .finish_resolution(audit.id, self.clock().now_ms())
            .await?;
        self.inner.wake.notify_waiters();
        Ok(GapAcceptance { audit, accepted })
    }
}
