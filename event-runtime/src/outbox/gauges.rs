//! The backlog gauges a worker process keeps: read from the store's cheap backlog query every
//! `metrics_interval` and set through the `metrics` crate. Changes nothing in the store.

use std::collections::BTreeSet;

use super::Outbox;

/// The per-destination counters, registered at 0 for each destination a process sees.
const COUNTERS: &[&str] = &[
    "events_deliveries_completed_total",
    "events_deliveries_failed_total",
    "events_delivery_retries_total",
    "events_deliveries_dead_lettered_total",
    "events_delivery_timeouts_total",
    "events_delivery_lease_lost_total",
];

/// The destinations a process has set gauges for: each is set again on every pass (to 0 once
/// it has nothing pending), so that a drained destination never keeps a stale age.
#[derive(Default)]
pub(super) struct Gauges {
    known: BTreeSet<String>,
}

impl Outbox {
    /// Sets the backlog gauges once (see [`METRICS`](crate::METRICS): backlog, oldest pending
    /// age, open dead letters, per-destination age and pause, held events, open gaps) from
    /// one read of [`Store::backlog`](crate::Store::backlog), and registers each destination's
    /// delivery counters at 0. The workers of [`spawn_workers`](Self::spawn_workers) do it
    /// every [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval); call
    /// it on such an interval when you run your own loop of
    /// [`deliver_batch`](Self::deliver_batch). Returns the backlog read.
    ///
    /// # Errors
    /// [`OutboxError::Store`](crate::OutboxError::Store) when the read fails (no gauge is set).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads, then sets gauges.
    pub async fn update_gauges(&self) -> Result<crate::Backlog, super::OutboxError> {
        let mut gauges = Gauges::default();
        Ok(gauges.update(self).await?)
    }
}

impl Gauges {
    /// Reads the backlog once and sets every gauge; a failed read sets nothing.
    pub(super) async fn update(
        &mut self,
        outbox: &Outbox,
    ) -> Result<crate::Backlog, crate::StoreError> {
        let now = outbox.inner.clock.now_ms();
        let backlog = outbox.inner.store.backend().backlog(now).await?;
        metrics::gauge!("events_outbox_backlog").set(backlog.pending() as f64);
        metrics::gauge!("events_outbox_oldest_pending_age_seconds")
            .set(backlog.oldest_pending_age_secs().unwrap_or(0.0));
        metrics::gauge!("events_dead_letters").set(backlog.dead_letters as f64);
        metrics::gauge!("events_inbox_held").set(backlog.held as f64);
        metrics::gauge!("events_inbox_open_gaps").set(backlog.open_gaps as f64);
        let names = outbox.destinations().iter().cloned();
        let names = names.chain(backlog.destinations.iter().map(|d| d.destination.clone()));
        for name in names.chain(backlog.paused.iter().cloned()) {
            if !self.known.contains(&name) {
                // A destination's counters exist from the start, at 0: a scrape tells "no
                // retries" from "not reported".
                for counter in COUNTERS {
                    metrics::counter!(*counter, "destination" => name.clone()).absolute(0);
                }
                self.known.insert(name);
            }
        }
        for name in &self.known {
            let age = backlog
                .destinations
                .iter()
                .find(|d| &d.destination == name)
                .map_or(0.0, |d| d.oldest_pending_age_secs);
            metrics::gauge!("events_destination_oldest_pending_age_seconds", "destination" => name.clone())
                .set(age);
            let paused = backlog.paused.contains(name);
            metrics::gauge!("events_destination_paused", "destination" => name.clone())
                .set(if paused { 1.0 } else { 0.0 });
        }
        Ok(backlog)
    }
}
