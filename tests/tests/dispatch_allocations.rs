//! Dispatching to plain-`fn` handlers allocates nothing: not with the guard off, not through
//! the guard while it fills up, not once it is full and evicts, not for a redelivery it skips.
//! Counted by a global allocator that counts this thread's allocations (so that tests running
//! on other threads do not disturb the count).
//!
//! What does allocate, by design: a failing or panicking handler (its error, and the report's
//! out-of-line part), an `async fn` handler (its boxed future), decoding a raw envelope.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::Dispatcher;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// How many allocations `f` made on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "alloc.counted", version = 1)]
struct Counted {
    #[event(aggregate_id)]
    id: u64,
    amount: u64,
}

#[derive(Default)]
struct Total(AtomicU64);

#[event_handler(name = "first")]
fn first(event: &Counted, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

#[event_handler(name = "second", priority = 1)]
fn second(event: &Envelope<Counted>, total: &Total) -> Result<(), HandlerError> {
    total.0.fetch_add(event.event().amount, Ordering::Relaxed);
    Ok(())
}

#[event_handler(name = "refuses")]
fn refuses(_: &Counted) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("no"))
}

#[event_handler(name = "later")]
async fn later(_: &Counted) {}

/// Polls once: every handler here is a plain `fn`, so the dispatch is ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("plain fn handlers complete on the first poll"),
    }
}

fn dispatcher(guard: usize) -> Dispatcher {
    Dispatcher::builder_empty()
        .handler::<first>()
        .handler::<second>()
        .resource(Total::default())
        .idempotency_capacity(guard)
        .build()
        .unwrap()
}

/// Dispatches `n` envelopes with fresh ids, checking each report.
fn dispatch_fresh(d: &Dispatcher, envelope: &mut Envelope<Counted>, from: u128, n: u128) {
    for i in from..from + n {
        envelope.metadata_mut().id = Uuid::from_u128(i);
        let report = ready(d.dispatch(&*envelope));
        assert!(report.is_success() && report.ran() == 2, "{report}");
    }
}

#[test]
fn a_dispatch_without_the_guard_allocates_nothing() {
    let d = dispatcher(0);
    let mut envelope = Envelope::new(Counted { id: 1, amount: 2 });
    dispatch_fresh(&d, &mut envelope, 0, 10); // warm: lazily initialised statics
    assert_eq!(
        allocations(|| dispatch_fresh(&d, &mut envelope, 10, 1_000)),
        0
    );
}

#[test]
fn a_dispatch_through_the_guard_allocates_nothing_while_it_fills_or_once_full() {
    let capacity = 500;
    let d = dispatcher(capacity);
    let mut envelope = Envelope::new(Counted { id: 1, amount: 2 });
    dispatch_fresh(&d, &mut envelope, 0, 1);
    // Two pairs per event: the guard fills after `capacity / 2` events, then evicts.
    assert_eq!(
        allocations(|| dispatch_fresh(&d, &mut envelope, 1, 5_000)),
        0
    );
    assert_eq!(d.guard_len(), capacity);

    // A redelivery the guard skips allocates nothing either.
    let skipped = allocations(|| {
        let report = ready(d.dispatch(&envelope));
        assert_eq!(report.duplicates(), 2);
    });
    assert_eq!(skipped, 0);
    assert_eq!(
        d.resource::<Total>().unwrap().0.load(Ordering::Relaxed),
        4 * 5_001
    );
}

#[test]
fn a_failure_allocates_its_error_and_the_report_of_it() {
    let d = Dispatcher::builder_empty()
        .handler::<refuses>()
        .build()
        .unwrap();
    let envelope = Envelope::new(Counted { id: 1, amount: 2 });
    ready(d.dispatch(&envelope));
    // Not remembered by the guard: the redelivery runs it, and fails, again.
    let n = allocations(|| {
        let report = ready(d.dispatch(&envelope));
        assert_eq!(report.failures(), 1);
    });
    assert!(n > 0);
}

#[test]
fn an_async_handler_allocates_its_future() {
    let d = Dispatcher::builder_empty()
        .handler::<later>()
        .idempotency_capacity(0)
        .build()
        .unwrap();
    let envelope = Envelope::new(Counted { id: 1, amount: 2 });
    assert_eq!(ready_or_spin(d.dispatch(&envelope)).ran(), 1);
    let mut ran = 0;
    let n = allocations(|| ran = ready_or_spin(d.dispatch(&envelope)).ran());
    assert_eq!(ran, 1);
    assert!(n > 0, "the boxed future of an async fn handler");
}

/// Polls until ready (an `async fn` handler that never waits completes on a later poll at
/// the latest).
fn ready_or_spin<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return v;
        }
    }
}
