//! The backlog gauges a worker process keeps: read from the store's cheap backlog query every
//! `metrics_interval` and set through the `metrics` crate. Changes nothing in the store.

use std::collections::BTreeSet;

use event_core::ErrorChain;

use super::Outbox;

/// The destinations a process has set gauges for: each is set again on every pass (to 0 once
/// it has nothing pending), so that a drained destination never keeps a stale age.
#[derive(Default)]
pub(super) struct Gauges {
    known: BTreeSet<String>,
}

impl Gauges {
    /// Reads the backlog once and sets every gauge; a failed read is logged and sets nothing.
    pub(super) async fn update(&mut self, outbox: &Outbox) {
        let now = outbox.inner.clock.now_ms();
        let backlog = match outbox.inner.store.backend().backlog(now).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "reading the outbox backlog failed");
                return;
            }
        };
        metrics::gauge!("events_outbox_backlog").set(backlog.pending() as f64);
        metrics::gauge!("events_outbox_oldest_pending_age_seconds")
            .set(backlog.oldest_pending_age_secs().unwrap_or(0.0));
        metrics::gauge!("events_dead_letters").set(backlog.dead_letters as f64);
        self.known.extend(outbox.destinations().iter().cloned());
        self.known
            .extend(backlog.destinations.iter().map(|d| d.destination.clone()));
        self.known.extend(backlog.paused.iter().cloned());
        for name in &self.known {
            let age = backlog
                .destinations
                .iter()
                .find(|d| &d.destination == name)
                .map_or(0.0, |d| d.oldest_pending_age_secs);
            metrics::gauge!("events_destination_oldest_pending_age_seconds", "handler" => name.clone())
                .set(age);
            let paused = backlog.paused.contains(name);
            metrics::gauge!("events_destination_paused", "handler" => name.clone())
                .set(if paused { 1.0 } else { 0.0 });
        }
    }
}
