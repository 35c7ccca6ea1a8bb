//! `cargo bench -p event-runtime --bench dispatch`: the cost of typed dispatch against a direct
//! call and against a naive `TypeId` map bus, all in one run (see BENCHMARKS.md).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main, Criterion};
use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::Dispatcher;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.happened", version = 1)]
struct Happened {
    #[event(aggregate_id)]
    id: u64,
    amount: u64,
}

#[derive(Default)]
struct Total(AtomicU64);

#[event_handler]
fn add(event: &Happened, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

/// Polls a future that completes without waiting (every handler here is sync).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("sync handlers complete on the first poll"),
    }
}

fn dispatcher(guard: usize, total: Arc<Total>) -> Dispatcher {
    Dispatcher::builder_empty()
        .handler::<add>()
        .resource_arc(total)
        .idempotency_capacity(guard)
        .build()
        .expect("valid registry")
}

type Bus = HashMap<TypeId, Vec<Box<dyn Fn(&dyn Any)>>>;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch");
    let mut envelope = Envelope::new(Happened { id: 1, amount: 3 });
    let total = Arc::new(Total::default());

    group.bench_function("direct_call", |b| {
        b.iter(|| add(black_box(envelope.event()), black_box(&total)))
    });

    let plain = dispatcher(0, Arc::clone(&total));
    let mut n = 0u128;
    group.bench_function("typed", |b| {
        b.iter(|| {
            n += 1;
            envelope.metadata_mut().id = Uuid::from_u128(n);
            ready(plain.dispatch(black_box(&envelope)))
        })
    });

    let guarded = dispatcher(event_runtime::DEFAULT_GUARD_CAPACITY, Arc::clone(&total));
    group.bench_function("typed_guarded", |b| {
        b.iter(|| {
            n += 1;
            envelope.metadata_mut().id = Uuid::from_u128(n);
            ready(guarded.dispatch(black_box(&envelope)))
        })
    });

    let mut bus: Bus = HashMap::new();
    let t = Arc::clone(&total);
    bus.entry(TypeId::of::<Happened>())
        .or_default()
        .push(Box::new(move |e: &dyn Any| {
            if let Some(e) = e.downcast_ref::<Happened>() {
                add(e, &t)
            }
        }));
    group.bench_function("typeid_map_baseline", |b| {
        b.iter(|| {
            let event: &Happened = black_box(envelope.event());
            if let Some(handlers) = bus.get(&event.type_id()) {
                for h in handlers {
                    h(event);
                }
            }
        })
    });
    group.finish();
    black_box(total.0.load(Ordering::Relaxed));
}

criterion_group!(benches, bench);
criterion_main!(benches);
