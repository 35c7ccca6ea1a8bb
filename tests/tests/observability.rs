//! Metrics through the `metrics` crate: what a delivery run reports, and the gauges the
//! workers keep (the age of each destination's oldest pending delivery), read back with
//! `metrics-util`'s debugging recorder.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_core::{event_handler, DomainEvent, Envelope, EventDescriptor, HandlerError};
use event_runtime::{
    Delivery, DeliveryError, Destination, Dispatcher, Outbox, OutboxConfig, RetryPolicy, Routing,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "meter.read", version = 1)]
struct Read {
    #[event(aggregate_id)]
    meter: String,
    outcome: u8,
}

static FAILED_ONCE: AtomicBool = AtomicBool::new(false);

#[event_handler(name = "meter.record")]
fn record(e: &Read) -> Result<(), HandlerError> {
    match e.outcome {
        1 if !FAILED_ONCE.swap(true, Ordering::SeqCst) => Err(HandlerError::transient_msg("busy")),
        2 => Err(HandlerError::permanent_msg("meter unknown")),
        _ => Ok(()),
    }
}

#[test]
fn deliveries_report_completions_failures_retries_dead_letters_and_durations() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let (_, store) = common::sqlite("metrics").await;
            let outbox = Outbox::builder(store)
                .dispatcher(Dispatcher::builder_empty().handler::<record>())
                .config(OutboxConfig::default().retry(RetryPolicy {
                    max_attempts: 3,
                    initial_backoff: Duration::from_millis(1),
                    max_backoff: Duration::from_millis(5),
                }))
                .build()
                .unwrap();
            for outcome in 0..3 {
                let mut uow = outbox.begin().await.unwrap();
                uow.add(Envelope::new(Read {
                    meter: format!("m{outcome}"),
                    outcome,
                }));
                uow.commit().await.unwrap();
            }
            outbox.drain(Duration::from_secs(10)).await.unwrap();
        })
    });
    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut histograms: HashMap<String, usize> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let handler = key
            .labels()
            .find(|l| l.key() == "destination")
            .map(|l| l.value().to_owned());
        assert_eq!(handler.as_deref(), Some("meter.record"), "{key:?}");
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                counters.insert(key.name().to_owned(), n);
            }
            (MetricKind::Histogram, DebugValue::Histogram(v)) => {
                histograms.insert(key.name().to_owned(), v.len());
            }
            _ => {}
        }
    }
    assert_eq!(counters["events_deliveries_completed_total"], 2);
    assert_eq!(counters["events_deliveries_failed_total"], 2);
    assert_eq!(counters["events_delivery_retries_total"], 1);
    assert_eq!(counters["events_deliveries_dead_lettered_total"], 1);
    assert_eq!(histograms["events_delivery_duration_seconds"], 2);
}

/// An external destination, as a relay is, whose broker is unreachable until it is opened.
struct Gate {
    open: AtomicBool,
}

#[async_trait]
impl Destination for Gate {
    fn name(&self) -> &str {
        "meter.gate"
    }
    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        (event.name == "meter.read").then_some(Routing { ordered: true })
    }
    async fn deliver(&self, _: &Delivery<'_>) -> Result<(), DeliveryError> {
        if self.open.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(DeliveryError::Unavailable {
                reason: "broker unreachable".into(),
                retry_after: Duration::from_millis(50),
            })
        }
    }
    async fn available(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// Polls the lag gauge of `handler` every 50 ms until `until` holds of it, for at most 10 s;
/// returns the last value.
async fn wait_for_gauge(
    gauges: &common::Gauges,
    handler: &str,
    until: impl Fn(Option<f64>) -> bool,
) -> Option<f64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v = gauges.get("events_destination_oldest_pending_age_seconds", handler);
        if until(v) || std::time::Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_oldest_pending_age_of_a_destination_grows_while_it_is_unreachable_and_is_0_once_drained() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for db in rt.block_on(common::databases("oldest_pending")) {
        let gauges = common::Gauges::new();
        metrics::with_local_recorder(&gauges, || {
            rt.block_on(async {
                let label = db.label();
                let gate = Arc::new(Gate {
                    open: AtomicBool::new(false),
                });
                let outbox = Outbox::builder(db.open().await)
                    .dispatcher(Dispatcher::builder_empty().event::<Read>())
                    .destination(gate.clone())
                    .config(
                        OutboxConfig::default()
                            .poll_interval(Duration::from_millis(20))
                            .metrics_interval(Duration::from_millis(100)),
                    )
                    .build()
                    .unwrap();
                for meter in ["m1", "m2", "m3"] {
                    let mut uow = outbox.begin().await.unwrap();
                    uow.add(Envelope::new(Read {
                        meter: meter.into(),
                        outcome: 0,
                    }));
                    uow.commit().await.unwrap();
                }
                let workers = outbox.spawn_workers(1);

                // Unreachable: the deliveries wait, and the gauge says for how long.
                let first = wait_for_gauge(&gauges, "meter.gate", |v| v > Some(0.3)).await;
                assert!(first > Some(0.3), "{label}: {first:?}");
                let later = wait_for_gauge(&gauges, "meter.gate", |v| v > first).await;
                assert!(
                    later > first,
                    "{label}: the age grows: {first:?} then {later:?}"
                );
                assert_eq!(outbox.store().stats().await.unwrap().pending, 3, "{label}");
                // What the gauges are read from.
                let backlog = outbox.store().backlog().await.unwrap();
                let pending: Vec<(&str, u64)> = backlog
                    .destinations
                    .iter()
                    .map(|d| (d.destination.as_str(), d.pending))
                    .collect();
                assert_eq!(pending, [("meter.gate", 3)], "{label}");
                assert!(backlog.destinations[0].oldest_pending_age_secs >= later.unwrap());
                assert_eq!(
                    backlog.paused,
                    ["meter.gate"],
                    "{label}: paused while unreachable"
                );
                assert_eq!(backlog.dead_letters, 0, "{label}");

                // Back: drained, and the gauge says 0 (set so, not left at its last age).
                gate.open.store(true, Ordering::SeqCst);
                let drained = wait_for_gauge(&gauges, "meter.gate", |v| v == Some(0.0)).await;
                assert_eq!(drained, Some(0.0), "{label}");
                assert_eq!(outbox.store().stats().await.unwrap().pending, 0, "{label}");
                let paused = gauges.get("events_destination_paused", "meter.gate");
                assert_eq!(paused, Some(0.0), "{label}: resumed");
                let backlog = outbox.store().backlog().await.unwrap();
                assert!(backlog.destinations.is_empty(), "{label}: {backlog:?}");
                assert!(backlog.paused.is_empty(), "{label}: {backlog:?}");
                workers.shutdown(Duration::from_secs(5)).await.unwrap();
            })
        });
    }
}
