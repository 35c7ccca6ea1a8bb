//! What an operator's tool asks of the [`Store`] beyond listing and resolving: counts of dead
//! letters, and pauses of a destination recorded with their audit row. Decides no delivery.

use super::tx::SqlValue;
use super::types::{AuditEntry, DeadLetterCount, DeadLetterFilter};
use super::{from_ms, now_ms, Store, StoreError, OPERATOR};

impl Store {
    /// How many dead letters match `filter`, ignoring its `limit` (so that a shortened list
    /// can say "showing 20 of 340").
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        self.backend.count_dead_letters(filter).await
    }

    /// Open and resolved dead letters per (handler, event name), ordered by both: which
    /// handlers and event names the dead letter queue knows.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn dead_letter_counts(&self) -> Result<Vec<DeadLetterCount>, StoreError> {
        self.backend.dead_letter_counts().await
    }

    /// [`pause_destination`](Self::pause_destination) and, in the same transaction, an audit
    /// row: action `pause`, `actor`, reason `DESTINATION: REASON`, no dead letters. Pausing a
    /// destination the operator paused already records the new reason (the pause keeps its
    /// start time) and a new audit row. Returns the audit row.
    ///
    /// Written with the outbox's own SQL through [`Tx`](super::Tx), so it needs a backend whose
    /// transactions speak it (the bundled SQLite and PostgreSQL ones).
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is changed then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn pause_destination_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
    ) -> Result<AuditEntry, StoreError> {
        // The same row as `Backend::pause` with `paused_by = OPERATOR` and no expiry.
        const PAUSE: &str = "INSERT INTO event_paused_destinations \
             (destination, paused_by, reason, paused_at, expires_at) VALUES ($1, $2, $3, $4, NULL) \
             ON CONFLICT (destination, paused_by) DO UPDATE SET reason = excluded.reason, expires_at = NULL";
        let now = now_ms();
        let mut tx = self.begin().await?;
        tx.execute(
            PAUSE,
            &[
                SqlValue::Text(destination),
                SqlValue::Text(OPERATOR),
                SqlValue::Text(reason),
                SqlValue::Int(now),
            ],
        )
        .await?;
        let entry = audit(
            &mut tx,
            "pause",
            actor,
            &format!("{destination}: {reason}"),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(entry)
    }

    /// [`resume_destination`](Self::resume_destination) and, in the same transaction, an
    /// audit row: action `resume`, `actor`, reason `DESTINATION: REASON`. Returns the audit
    /// row, or `None` when the operator had not paused `destination` (nothing is written
    /// then). A runtime component's pause of the same destination stays.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is changed then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn resume_destination_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Option<AuditEntry>, StoreError> {
        const RESUME: &str =
            "DELETE FROM event_paused_destinations WHERE destination = $1 AND paused_by = $2";
        let now = now_ms();
        let mut tx = self.begin().await?;
        let n = tx
            .execute(
                RESUME,
                &[SqlValue::Text(destination), SqlValue::Text(OPERATOR)],
            )
            .await?;
        if n == 0 {
            tx.rollback().await?;
            return Ok(None);
        }
        let entry = audit(
            &mut tx,
            "resume",
            actor,
            &format!("{destination}: {reason}"),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(Some(entry))
    }
}

/// Appends an audit row that names no dead letters.
pub(super) async fn audit(
    tx: &mut super::Tx,
    action: &'static str,
    actor: &str,
    reason: &str,
    now: i64,
) -> Result<AuditEntry, StoreError> {
    const AUDIT: &str =
        "INSERT INTO event_audit_log (action, actor, reason, at, dead_letter_ids, count, finished_at) \
         VALUES ($1, $2, $3, $4, '[]', 0, $4) RETURNING id";
    let id = tx
        .fetch_i64(
            AUDIT,
            &[
                SqlValue::Text(action),
                SqlValue::Text(actor),
                SqlValue::Text(reason),
                SqlValue::Int(now),
            ],
        )
        .await?
        .ok_or_else(|| StoreError::Corrupt("the audit log returned no id".into()))?;
    Ok(AuditEntry {
        id,
        action: action.to_owned(),
        actor: actor.to_owned(),
        reason: reason.to_owned(),
        at: from_ms(now),
        dead_letter_ids: Vec::new(),
        count: 0,
        selection: None,
        finished_at: Some(from_ms(now)),
    })
}
