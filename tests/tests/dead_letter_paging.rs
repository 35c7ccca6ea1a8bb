//! Replay and purge over a selection run in bounded pages: peak memory does not grow with the
//! number of dead letters (20,000 against 2,000, counted by this binary's global allocator;
//! the operation over 20,000 is interrupted and resumed, and counted whole),
//! and an operation interrupted part-way is finished by `resume_resolution` on the same audit
//! row, resolving each dead letter once. SQLite and PostgreSQL, one after the other (the
//! allocator counts the whole process, so nothing else runs beside the measurement).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::{DeadLetterFilter, Dispatcher, Outbox, OutboxConfig, Resolution, Store};
use serde::{Deserialize, Serialize};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "paging.failed", version = 1)]
struct Failed {
    #[event(aggregate_id)]
    key: String,
    /// About 1 KiB, so that loading envelopes would show.
    padding: String,
}

#[event_handler(name = "paging.refuse", unordered)]
async fn refuse(_: &Envelope<Failed>) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("refused by the test"))
}

fn outbox(store: Store) -> Outbox {
    Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<refuse>())
        .config(OutboxConfig::default().batch_size(1000).concurrency(64))
        .build()
        .unwrap()
}

/// Commits `n` events whose delivery is dead-lettered at once; returns the handler's filter.
async fn dead_letters(outbox: &Outbox, tag: &str, n: usize) -> DeadLetterFilter {
    let t = std::time::Instant::now();
    for chunk in 0..n.div_ceil(1000) {
        let mut uow = outbox.begin().await.unwrap();
        for i in chunk * 1000..((chunk + 1) * 1000).min(n) {
            uow.add(Envelope::new(Failed {
                key: format!("{tag}-{i}"),
                padding: "x".repeat(1024),
            }));
        }
        uow.commit().await.unwrap();
    }
    eprintln!("{tag}: {n} committed in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let report = outbox.drain(Duration::from_secs(600)).await.unwrap();
    assert_eq!(report.dead_lettered, n);
    eprintln!("{tag}: {n} dead-lettered in {:?}", t.elapsed());
    DeadLetterFilter::default()
}

async fn memory_and_resume(label: &str, store: Store) {
    let outbox = outbox(store.clone());

    // 2,000 dead letters purged in one go.
    let filter = dead_letters(&outbox, "small", 2_000).await;
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let entry = store
        .resolve_matching(&filter, Resolution::Purge, "test", "memory", |_| {})
        .await
        .unwrap();
    let small = PEAK.load(Ordering::SeqCst).saturating_sub(base);
    assert_eq!(entry.count, 2_000, "{label}");
    assert!(entry.finished_at.is_some(), "{label}");

    // 20,000 replayed: interrupted after its first page, then resumed on the same audit row.
    dead_letters(&outbox, "large", 20_000).await;
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let op = store.resolve_matching(&filter, Resolution::Replay, "test", "resume", move |n| {
        let _ = tx.send(n);
    });
    tokio::select! {
        _ = op => panic!("{label}: the replay finished before it could be interrupted"),
        _ = rx.recv() => {}
    }
    let log = store.audit_log(1).await.unwrap();
    let unfinished = &log[0];
    assert!(unfinished.finished_at.is_none(), "{label}: {unfinished:?}");
    assert!(
        unfinished.count > 0 && unfinished.count < 20_000,
        "{label}: {unfinished:?}"
    );
    assert!(unfinished.selection.is_some(), "{label}");
    let open = store.count_dead_letters(&filter).await.unwrap();
    assert_eq!(
        open + unfinished.count,
        20_000,
        "{label}: pages done are kept"
    );

    let t = std::time::Instant::now();
    let finished = store
        .resume_resolution(unfinished.id, |_| {})
        .await
        .unwrap();
    let large = PEAK.load(Ordering::SeqCst).saturating_sub(base);
    eprintln!("{label}: resumed in {:?}", t.elapsed());
    assert_eq!(finished.id, unfinished.id, "{label}: one audit row");
    assert_eq!(finished.count, 20_000, "{label}");
    assert!(finished.finished_at.is_some(), "{label}");
    assert_eq!(store.count_dead_letters(&filter).await.unwrap(), 0);
    let t = std::time::Instant::now();
    let pending = store.stats().await.unwrap().pending;
    eprintln!("{label}: stats in {:?}", t.elapsed());
    assert_eq!(pending, 20_000, "{label}: each replayed once");

    eprintln!(
        "{label}: peak heap growth resolving 2,000 dead letters: {small} B, 20,000: {large} B"
    );
    assert!(
        large <= small * 3 / 2 + (256 << 10),
        "{label}: resolving 20,000 dead letters took {large} B at peak against {small} B for 2,000: memory grows with the count"
    );

    // Resuming a finished operation changes nothing; an unknown one is an error.
    let again = store
        .resume_resolution(unfinished.id, |_| {})
        .await
        .unwrap();
    assert_eq!(again.count, 20_000);
    assert!(matches!(
        store.resume_resolution(-1, |_| {}).await,
        Err(event_runtime::StoreError::NoSuchResolution { audit_id: -1 })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_purge_run_in_pages_of_constant_memory_and_resume() {
    let (_, sqlite) = common::sqlite("paging").await;
    memory_and_resume("sqlite", sqlite).await;
    if let Some((_, _, pg)) = common::postgres("paging").await {
        memory_and_resume("postgres", pg).await;
    }
}
