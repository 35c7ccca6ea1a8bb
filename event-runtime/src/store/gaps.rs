//! Gaps in received aggregates' chains, for operators: listed, and accepted (audited, in
//! pages). Finding them is the outbox's ([`Outbox::detect_gaps`](crate::Outbox::detect_gaps));
//! the SQL is the backend's.

use super::backend::Gap;
use super::types::AuditEntry;
use super::{now_ms, Store, StoreError};
use crate::store::backend::AuditStamp;

/// Gaps accepted per transaction by [`Store::accept_gaps`].
const ACCEPT_PAGE: usize = 200;

/// What [`Store::accept_gaps`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GapAcceptance {
    /// The audit row (action `gap-accept`), finished, its count the gaps accepted; `None`
    /// when no selected gap was open (nothing was accepted, and no row written).
    pub audit: Option<AuditEntry>,
    /// The gaps accepted, in id order (one that closed meanwhile is left out).
    pub accepted: Vec<Gap>,
}

impl Store {
    /// The gaps, in id order: the open ones, or every one (closed ones with how they closed)
    /// with `include_closed`.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn gaps(&self, include_closed: bool) -> Result<Vec<Gap>, StoreError> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let page = self.backend().gaps(include_closed, after, 1_000).await?;
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
    /// released to their handlers in chain order; a missing event that arrives afterwards is
    /// dead-lettered as `late`. Audited (action `gap-accept`: one row for the operation, its
    /// selection, its count the gaps accepted, finished when the last page is); done in
    /// pages of 200 gaps, one transaction each, so an interrupted call leaves the rest open
    /// and calling it again accepts them. An id that is not an open gap is skipped; when no
    /// selected gap is open, nothing is written (no audit row). `reason` goes to the audit
    /// log as given (the `events` tool refuses an empty one).
    ///
    /// # Errors
    /// [`StoreError`] when the database fails (the pages committed stay accepted).
    ///
    /// # Cancel safety
    /// Cancel safe: each page commits or not as a whole; the audit row stays unfinished.
    pub async fn accept_gaps(
        &self,
        ids: Option<&[i64]>,
        actor: &str,
        reason: &str,
    ) -> Result<GapAcceptance, StoreError> {
        let store = self.backend();
        let open: Vec<i64> = self.gaps(false).await?.iter().map(|g| g.id).collect();
        let wanted: Vec<i64> = match ids {
            Some(ids) => open.into_iter().filter(|id| ids.contains(id)).collect(),
            None => open,
        };
        if wanted.is_empty() {
            return Ok(GapAcceptance {
                audit: None,
                accepted: Vec::new(),
            });
        }
        let selection = serde_json::json!({ "gaps": ids }).to_string();
        let log = self.logging()?;
        let audit = log
            .start_audit(
                "gap-accept",
                Some(&selection),
                &AuditStamp::now(actor, reason),
            )
            .await?;
        let mut accepted = Vec::new();
        for page in wanted.chunks(ACCEPT_PAGE) {
            accepted.extend(store.accept_gaps(page, audit.id, now_ms()).await?);
        }
        let audit = Some(log.finish_operation(audit.id, now_ms()).await?);
        Ok(GapAcceptance { audit, accepted })
    }
}
