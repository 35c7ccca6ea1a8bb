//! `cargo bench -p event-runtime --features otel --bench telemetry`: what one trace from
//! command to handler costs. Each iteration commits 100 events (one unit of work, inside a
//! command span) into an SQLite outbox and drains their deliveries to a
//! handler that does nothing; `Throughput::Elements` = 100. Each case has an outbox of its own
//! over `sqlite::memory:` (no fsync: what tracing costs in CPU stands out, the worst ratio a
//! real database would show). Three cases, in one run:
//!
//! - `untraced`: no subscriber (the baseline);
//! - `registry_only`: a `tracing` subscriber (a registry) with no OpenTelemetry layer (the `tracing` spans exist, no
//!   context is stored);
//! - `otel`: the `tracing-opentelemetry` layer over the SDK with an in-memory exporter (reset
//!   every iteration): a create span per event at commit, its context stored in the envelope,
//!   a process span per delivery as its child.
//!
//! See BENCHMARKS.md (*Observability*).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::{Dispatcher, Outbox, Store};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tracing::{Dispatch, Instrument};
use tracing_subscriber::layer::SubscriberExt;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.traced", version = 1)]
struct Traced {
    #[event(aggregate_id)]
    stream: String,
    value: u64,
}

#[event_handler(name = "bench.traced_noop")]
fn noop(_: &Traced) {}

const EVENTS: usize = 100;

async fn one_command(outbox: &Outbox) {
    let stream = Uuid::now_v7().to_string();
    async {
        let mut uow = outbox.begin().await.unwrap();
        for i in 1..=EVENTS {
            uow.add(
                Envelope::new(Traced {
                    stream: stream.clone(),
                    value: i as u64,
                })
                .with_sequence(i as u64),
            );
        }
        uow.commit().await.unwrap();
    }
    .instrument(tracing::info_span!("command"))
    .await;
    let report = outbox.drain(Duration::from_secs(60)).await.unwrap();
    assert_eq!(report.completed, EVENTS);
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let otel = Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"))),
    );
    let plain = Dispatch::new(tracing_subscriber::registry());

    let mut g = c.benchmark_group("telemetry");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(10));
    let cases: [(&str, Option<&Dispatch>); 3] = [
        ("untraced", None),
        ("registry_only", Some(&plain)),
        ("otel", Some(&otel)),
    ];
    for (name, dispatch) in cases {
        let outbox = rt.block_on(async {
            Outbox::builder(Store::connect("sqlite::memory:").await.unwrap())
                .dispatcher(Dispatcher::builder_empty().handler::<noop>())
                .build()
                .unwrap()
        });
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    match dispatch {
                        Some(d) => tracing::dispatcher::with_default(d, || {
                            rt.block_on(one_command(&outbox))
                        }),
                        None => rt.block_on(one_command(&outbox)),
                    }
                    exporter.reset();
                }
                started.elapsed()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
