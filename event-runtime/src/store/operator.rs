//! What an operator's tool asks of the [`Store`] beyond listing and resolving: counts of dead
//! letters, and pauses of a destination recorded with their audit row. Decides no delivery;
//! the SQL is the backend's.

use super::backend::AuditStamp;
use super::types::{AuditEntry, DeadLetterCount, DeadLetterFilter};
use super::{Store, StoreError};

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
        self.inspecting()?.count_dead_letters(filter).await
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
        self.inspecting()?.dead_letter_counts().await
    }

    /// [`pause_destination`](Self::pause_destination) and, in the same transaction, an audit
    /// row: action `pause`, `actor`, reason `DESTINATION: REASON`, no dead letters. Pausing a
    /// destination the operator paused already records the new reason (the pause keeps its
    /// start time) and a new audit row. Returns the audit row.
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
        self.operating()?
            .pause_audited(destination, &AuditStamp::now(actor, reason))
            .await
    }

    /// [`resume_destination`](Self::resume_destination) and, in the same transaction, an
    /// audit row: action `resume`, `actor`, reason `DESTINATION: REASON`. A circuit breaker's
    /// pause of it (`paused_by` `breaker`) is lifted too: the deliveries flow at once, and a
    /// breaker that still sees failures trips again. Returns the audit row, or `None` when
    /// neither an operator nor a breaker had paused `destination` (nothing is written then).
    /// A runtime component's pause of the same destination stays.
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
        self.operating()?
            .resume_audited(destination, &AuditStamp::now(actor, reason))
            .await
    }
}
