//! What a destination added to an existing outbox never gets: the events committed before it
//! was configured have no delivery row for it, and nothing writes one later. Reads only;
//! re-routing them is not its business.

use super::value::Datum;
use super::{Store, StoreError};

/// [`Store::unrouted_events`] counts up to this many events.
pub(crate) const UNROUTED_CAP: u64 = 10_000;

impl Store {
    /// Whether `destination` was added to an outbox that already held events: `None` when it
    /// has a delivery row (it was routed events, whatever their state), otherwise how many
    /// events named in `names` were recorded at or after `since_ms` (counted up to
    /// [`UNROUTED_CAP`]) — committed before the destination existed, so never delivered to
    /// it. `since_ms` should be no older than the retention: a completed delivery older than
    /// that may have been purged, and its event would be counted wrongly.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub(crate) async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        const ROUTED: &str = "SELECT 1 AS one FROM event_deliveries WHERE handler = $1 LIMIT 1";
        let routed = self
            .backend()
            .fetch(ROUTED, &[Datum::Text(destination.to_owned())], true)
            .await?;
        if !routed.is_empty() {
            return Ok(None);
        }
        if names.is_empty() {
            return Ok(Some(0));
        }
        let list: Vec<String> = (0..names.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM event_outbox \
             WHERE recorded_at >= $1 AND name IN ({}) LIMIT $2) AS e",
            list.join(", ")
        );
        let mut args = vec![Datum::Int(since_ms), Datum::Int(UNROUTED_CAP as i64)];
        args.extend(names.iter().map(|n| Datum::Text((*n).to_owned())));
        let rows = self.backend().fetch(&sql, &args, true).await?;
        let n = match rows.first() {
            Some(row) => row.get::<i64>("n")?,
            None => 0,
        };
        Ok(Some(n.max(0) as u64))
    }
}
