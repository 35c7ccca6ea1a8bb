//! Replay and purge of dead letters over a selection, in bounded pages, resumable: the
//! [`Store`] side of `events dlq replay|purge`. The SQL is the backend's.

use super::backend::ResolutionSelection;
use super::types::{AuditEntry, DeadLetterFilter, Resolution};
use super::{now_ms, Store, StoreError};
use crate::store::backend::AuditStamp;

/// Dead letters resolved per transaction by [`Store::resolve_matching`].
pub const RESOLVE_PAGE: u32 = 500;

impl Store {
    /// Replays (`Replay`) or purges (`Purge`) every open dead letter `filter` selects, in
    /// pages of [`RESOLVE_PAGE`] dead letters, each page its own transaction, with one audit
    /// row for the whole operation. `filter.limit` caps how many; `filter.include_resolved`
    /// is ignored (only open dead letters are resolved). Dead letters that arrive while it
    /// runs are not touched (the selection ends at the newest one when it started).
    ///
    /// Memory stays one page of ids whatever the count (envelopes are never loaded), and on
    /// SQLite the write lock is released between pages, so deliveries and commits go on.
    /// `progress(n)` is called after each page with the number resolved so far. Replay makes
    /// each delivery due now with its attempts reset and the same event id; purge marks it
    /// `purged` so that later events of its aggregate flow.
    ///
    /// The audit row is written first, unfinished, with the selection
    /// ([`AuditEntry::selection`]); each page adds to its `count`, and each dead letter it
    /// resolved names it. If the operation is interrupted (a crash, a dropped future, a
    /// failed page) the pages done stay done, and [`resume_resolution`](Self::resume_resolution)
    /// with the audit id finishes it. Returns the finished audit row.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the pages before the failure stay done; resume with the
    /// audit id (the last row of [`audit_log`](Self::audit_log) with `finished_at` unset).
    ///
    /// # Cancel safety
    /// Not cancel safe as one operation: dropped between pages, the pages done stay done and
    /// the audit row stays unfinished; dropped inside a page, that page rolls back. Nothing is
    /// resolved twice; [`resume_resolution`](Self::resume_resolution) finishes the rest.
    pub async fn resolve_matching(
        &self,
        filter: &DeadLetterFilter,
        action: Resolution,
        actor: &str,
        reason: &str,
        progress: impl FnMut(u64) + Send,
    ) -> Result<AuditEntry, StoreError> {
        // Every capability the whole operation needs, before its first write.
        let resolving = self.resolving()?;
        self.logging()?;
        let start = resolving
            .start_resolution(filter, action, &AuditStamp::now(actor, reason))
            .await?;
        self.resolve_pages(start.entry.id, action, &start.selection, 0, progress)
            .await
    }

    /// Finishes an interrupted [`resolve_matching`](Self::resolve_matching): resolves what is
    /// still open of its selection, adding to the same audit row. A finished operation is
    /// returned as it is.
    ///
    /// # Errors
    /// [`StoreError::NoSuchResolution`] when `audit_id` names no replay or purge over a
    /// selection; [`StoreError::Database`] as for `resolve_matching`.
    ///
    /// # Cancel safety
    /// As [`resolve_matching`](Self::resolve_matching).
    pub async fn resume_resolution(
        &self,
        audit_id: i64,
        progress: impl FnMut(u64) + Send,
    ) -> Result<AuditEntry, StoreError> {
        let resolving = self.resolving()?;
        self.logging()?;
        let Some(op) = resolving.resolution(audit_id).await? else {
            return Err(StoreError::NoSuchResolution { audit_id });
        };
        if op.entry.finished_at.is_some() {
            return Ok(op.entry);
        }
        self.resolve_pages(audit_id, op.action, &op.selection, op.entry.count, progress)
            .await
    }

    async fn resolve_pages(
        &self,
        audit_id: i64,
        action: Resolution,
        selection: &ResolutionSelection,
        mut done: u64,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<AuditEntry, StoreError> {
        loop {
            let left = selection.limit.map_or(u64::MAX, |l| l.saturating_sub(done));
            if left == 0 {
                break;
            }
            let page = left.min(u64::from(RESOLVE_PAGE)) as u32;
            let done_now = self
                .resolving()?
                .resolve_page(audit_id, action, selection, page, now_ms())
                .await?;
            done += done_now.resolved;
            progress(done);
            if done_now.selected < u64::from(page) {
                break;
            }
        }
        self.logging()?.finish_operation(audit_id, now_ms()).await
    }
}
