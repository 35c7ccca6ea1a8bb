//! What a destination added to an existing outbox never gets: the events committed before it
//! was configured have no delivery row for it, and nothing writes one later. Reads only;
//! re-routing them is not its business. The SQL is the backend's.

use super::{Store, StoreError};

/// [`Store::unrouted_events`] counts up to this many events.
pub const UNROUTED_CAP: u64 = 10_000;

impl Store {
    /// Whether `destination` was added to an outbox that already held events: `None` when it
    /// has a delivery row (it was routed events, whatever their state), otherwise how many
    /// events named in `names` were recorded at or after `since_ms` (milliseconds since the Unix epoch; counted up to
    /// [`UNROUTED_CAP`]) — committed before the destination existed, so never delivered to
    /// it. `since_ms` should be no older than the retention: a completed delivery older than
    /// that may have been purged, and its event would be counted wrongly.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        self.inspecting()?
            .unrouted_events(destination, names, since_ms, UNROUTED_CAP)
            .await
    }
}
