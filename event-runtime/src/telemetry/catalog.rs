//! Every metric the runtime reports through the `metrics` facade, with its kind, unit, labels
//! and meaning: [`METRICS`], and [`describe_metrics`] to give an installed recorder (a
//! Prometheus exporter) the units and help texts.
//!
//! Names and units follow the Prometheus conventions (`_total` for counters, base units in
//! the name: `_seconds`); labels name a destination, an inbox group, a queue or a failure reason, never
//! a payload value, so that their cardinality is the application's count of destinations.

use metrics::Unit;

/// What a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricKind {
    /// Only grows; `_total`.
    Counter,
    /// Set to the current value.
    Gauge,
    /// A distribution of observed values.
    Histogram,
}

/// One metric of [`METRICS`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Metric {
    /// The name, as exported.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The unit of its values.
    pub unit: Unit,
    /// Its label names (none, or `destination`, `group`, `reason`, `queue`).
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
    /// For a histogram, the bucket bounds to export it with (the Prometheus exporter of the
    /// `metrics` crate renders a summary unless buckets are set).
    pub buckets: Option<&'static [f64]>,
}

/// The bucket bounds of `events_delivery_duration_seconds`, in seconds: from a 1 ms handler
/// call to a minute-long publication under a broker's retries.
pub const DELIVERY_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const fn metric(
    name: &'static str,
    kind: MetricKind,
    unit: Unit,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        unit,
        labels,
        help,
        buckets: None,
    }
}

use MetricKind::{Counter, Gauge, Histogram};
const DEST: &[&str] = &["destination"];

/// Every metric the runtime reports. The gauges of the outbox (`events_outbox_*`,
/// `events_destination_*`, `events_dead_letters`, `events_inbox_held`,
/// `events_inbox_open_gaps`) describe the whole store and are set by every worker process
/// sharing it every [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval):
/// aggregate them across processes with `max`, not `sum`. The rest count what this process
/// did.
pub const METRICS: &[Metric] = &[
    metric("events_outbox_backlog", Gauge, Unit::Count, &[],
        "Pending deliveries, every destination."),
    metric("events_outbox_oldest_pending_age_seconds", Gauge, Unit::Seconds, &[],
        "Age of the oldest pending delivery since its commit; 0 when none is pending."),
    metric("events_dead_letters", Gauge, Unit::Count, &[],
        "Open dead letters (not replayed or purged)."),
    metric("events_destination_oldest_pending_age_seconds", Gauge, Unit::Seconds, DEST,
        "Age of the destination's oldest pending delivery since its commit, 0 when none: for a relay, its lag."),
    metric("events_destination_paused", Gauge, Unit::Count, DEST,
        "1 while the destination is paused (an operator, its broker unavailable, its circuit breaker), else 0."),
    metric("events_circuit_breaker_open", Gauge, Unit::Count, DEST,
        "1 while this process sees the handler's circuit breaker open (paused by a breaker), else 0."),
    metric("events_circuit_breaker_trips_total", Counter, Unit::Count, DEST,
        "Times this process tripped the handler's circuit breaker."),
    metric("events_inbox_held", Gauge, Unit::Count, &[],
        "Received events held back until their predecessor arrives."),
    metric("events_inbox_open_gaps", Gauge, Unit::Count, &[],
        "Open gaps: a predecessor that has not arrived after gap_after."),
    metric("events_deliveries_completed_total", Counter, Unit::Count, DEST,
        "Deliveries completed."),
    metric("events_deliveries_failed_total", Counter, Unit::Count, DEST,
        "Delivery attempts that failed (a timeout, an error, a panic)."),
    metric("events_delivery_retries_total", Counter, Unit::Count, DEST,
        "Failed attempts scheduled for a retry."),
    metric("events_delivery_timeouts_total", Counter, Unit::Count, DEST,
        "Attempts that ran out of the destination's time limit."),
    metric("events_deliveries_dead_lettered_total", Counter, Unit::Count, DEST,
        "Deliveries put in the dead letter queue."),
    metric("events_delivery_lease_lost_total", Counter, Unit::Count, DEST,
        "Deliveries whose lease another worker took over before they were recorded."),
    Metric {
        buckets: Some(DELIVERY_DURATION_BUCKETS),
        ..metric("events_delivery_duration_seconds", Histogram, Unit::Seconds, DEST,
            "Duration of a completed delivery attempt (a handler's run, a relay's publication).")
    },
    metric("events_inbox_gaps_opened_total", Counter, Unit::Count, &[],
        "Gaps opened: a predecessor missing after gap_after."),
    metric("events_inbox_invalid_prevsequence_total", Counter, Unit::Count, &[],
        "Received events whose prevsequence names no earlier event of their aggregate."),
    metric("events_nats_published_total", Counter, Unit::Count, &[],
        "Events the relay published, acknowledged by the stream."),
    metric("events_nats_published_duplicates_total", Counter, Unit::Count, &[],
        "Publications the stream acknowledged as duplicates (its duplicate window)."),
    metric("events_nats_publish_failures_total", Counter, Unit::Count, &["reason"],
        "Publications that failed, by reason."),
    metric("events_nats_in_flight", Gauge, Unit::Count, &[],
        "Publications awaiting the stream's acknowledgement."),
    metric("events_nats_received_total", Counter, Unit::Count, &[],
        "Messages the inbox fetched."),
    metric("events_nats_duplicates_total", Counter, Unit::Count, &[],
        "Fetched messages already in the outbox (redeliveries)."),
    metric("events_nats_dead_lettered_total", Counter, Unit::Count, &[],
        "Fetched messages the inbox put in the dead letter queue."),
    metric("events_nats_acked_total", Counter, Unit::Count, &[],
        "Messages acknowledged after their commit."),
    metric("events_nats_terminated_total", Counter, Unit::Count, &[],
        "Dead-lettered messages terminated on the server."),
    metric("events_nats_naked_total", Counter, Unit::Count, &[],
        "Messages negatively acknowledged because their commit failed."),
    metric("events_nats_partition_mismatches_total", Counter, Unit::Count, &[],
        "Messages received on a partition their aggregate does not belong to."),
    metric("events_nats_group_partitions_held", Gauge, Unit::Count, &["group"],
        "Partitions this instance of the group holds."),
    metric("events_rabbitmq_group_partitions_held", Gauge, Unit::Count, &["group"],
        "Partition queues this instance of the group holds."),
    metric("events_rabbitmq_parked_messages", Gauge, Unit::Count, &["queue"],
        "Messages in the parking queue: given up on by the broker after the delivery limit."),
];

/// Gives the installed `metrics` recorder the unit and help text of every metric of
/// [`METRICS`] (a Prometheus exporter writes them as `# HELP` lines). Call it once, after
/// installing the recorder; [`Outbox::spawn_workers`](crate::Outbox::spawn_workers) calls it
/// too. Without a recorder it does nothing.
pub fn describe_metrics() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.unit, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.unit, m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, m.unit, m.help),
        }
    }
}

/// Registers the counters `names` (no labels) at 0, so that a scrape shows them before
/// their first event.
pub(crate) fn register_zero(names: &[&'static str]) {
    for name in names {
        metrics::counter!(*name).absolute(0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::METRICS;

    fn sources(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }

    /// Every metric the source reports is in the catalogue with its kind, and every one of
    /// the catalogue is reported and listed in the crate docs.
    #[test]
    fn the_catalogue_is_what_the_code_reports() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut text = String::new();
        sources(&src, &mut text);
        let mut reported = BTreeSet::new();
        for kind in ["counter", "gauge", "histogram"] {
            let pattern = format!("metrics::{kind}!(\"");
            for (i, _) in text.match_indices(&pattern) {
                let rest = &text[i + pattern.len()..];
                let name = &rest[..rest.find('"').unwrap()];
                reported.insert((kind.to_owned(), name.to_owned()));
            }
        }
        let catalogued: BTreeSet<(String, String)> = METRICS
            .iter()
            .map(|m| (format!("{:?}", m.kind).to_lowercase(), m.name.to_owned()))
            .collect();
        assert_eq!(reported, catalogued);
        let docs = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        for m in METRICS {
            assert!(docs.contains(m.name), "{} is not in the crate docs", m.name);
            let suffix_ok = match m.kind {
                super::MetricKind::Counter => m.name.ends_with("_total"),
                _ => !m.name.ends_with("_total"),
            };
            assert!(suffix_ok, "{}", m.name);
            if m.unit == metrics::Unit::Seconds {
                assert!(m.name.ends_with("_seconds"), "{}", m.name);
            }
        }
    }
}
