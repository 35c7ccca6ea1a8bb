//! Metrics through the `metrics` crate: what a delivery run reports, read back with
//! `metrics-util`'s debugging recorder.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::{Dispatcher, Outbox, OutboxConfig, RetryPolicy};
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
                .config(OutboxConfig {
                    retry: RetryPolicy {
                        max_attempts: 3,
                        initial_backoff: Duration::from_millis(1),
                        max_backoff: Duration::from_millis(5),
                    },
                    ..OutboxConfig::default()
                })
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
            .find(|l| l.key() == "handler")
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
    assert_eq!(histograms["events_handler_duration_seconds"], 2);
}
