//! Retention: completed deliveries and the events nothing refers to are deleted once older
//! than the retention, in bounded statements, by one purger at a time, while deliveries keep
//! flowing; nothing pending, leased or dead-lettered is touched; and an event purged from the
//! outbox is a new event when it is committed again (the de-duplication window).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_core::Envelope;

use super::engine::{
    commit, external, external2, fast, scalar, setup, status_is, Act, Calls, Ticked,
};
use super::Case;
use crate::{Clock, Dispatcher, Outbox, SqlValue, Store};

const HOUR_MS: i64 = 3_600_000;
const DRAIN: Duration = Duration::from_secs(60);

/// The wall clock, moved forward by the test.
#[derive(Debug, Default)]
struct Later(AtomicI64);

impl Clock for Later {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis() + self.0.load(Ordering::SeqCst)
    }
}

async fn count(store: &Store, sql: &'static str) -> i64 {
    scalar(store, sql, &[]).await
}

pub async fn retention_purges_old_rows_in_bounded_steps_and_nothing_else(db: &Case) {
    let label = db.label();
    let calls = Arc::new(Calls::default());
    let clock = Arc::new(Later::default());
    let store = db.open().await;
    setup(&store).await;
    let outbox = Outbox::builder(store.clone())
        .dispatcher(
            // Handlers without a transaction: one waiting for the gate holds no lock (a
            // handler in the transaction would hold SQLite's write lock while it waits).
            Dispatcher::builder_empty()
                .handler::<external>()
                .handler::<external2>(),
        )
        .resource_arc(Arc::clone(&calls))
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .config(
            fast()
                .retention(Duration::from_secs(3600))
                .retention_batch(7),
        )
        .build()
        .unwrap();

    // Old: 30 events delivered to both handlers.
    let old = commit(&outbox, "old", 1, vec![Act::Ok; 30]).await;
    outbox.drain(DRAIN).await.unwrap();
    // Old and dead: one handler refuses it (the other completes).
    let dead = commit(&outbox, "dead", 1, vec![Act::Refuse("no".into())]).await;
    outbox.drain(DRAIN).await.unwrap();
    // Old and pending: its delivery to a paused handler waits.
    store
        .pause_destination("engine.ext2", "held back by the test")
        .await
        .unwrap();
    let pending = commit(&outbox, "pending", 1, vec![Act::Ok]).await;
    outbox.drain(DRAIN).await.unwrap();
    // Old and (once the clock has moved) leased: a worker runs its handler, which waits for
    // the gate. (Claimed before the clock moved, its lease would look expired for a moment
    // and be claimed again.)
    let leased = commit(&outbox, "leased", 1, vec![Act::Gate]).await;

    let deliveries_before = count(&store, "SELECT COUNT(*) FROM event_deliveries").await;
    let waiting = "SELECT COUNT(*) FROM event_deliveries WHERE status IN ('pending', 'dead') AND aggregate_id <> 'fresh'";
    let waiting_before = count(&store, waiting).await;
    let letters = "SELECT COUNT(*) FROM event_dead_letters";
    let letters_before = count(&store, letters).await;
    assert_eq!(letters_before, 1, "{label}");
    // dead: 1; pending: 1 (paused); leased: 1 running, 1 paused.
    assert_eq!(waiting_before, 4, "{label}");
    let completed_old = deliveries_before - waiting_before;
    assert_eq!(completed_old, 30 * 2 + 1 + 1, "{label}");

    // Nothing is older than the retention yet.
    let none = outbox.purge_expired().await.unwrap();
    assert_eq!((none.deliveries, none.events), (0, 0), "{label}: {none:?}");

    // Two hours later, while new events flow.
    clock.0.store(2 * HOUR_MS, Ordering::SeqCst);
    let workers = outbox.spawn_workers(1);
    for _ in 0..2000 {
        if calls.of(leased[0]) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(calls.of(leased[0]), 1, "{label}: the gated handler runs");
    let fresh = commit(&outbox, "fresh", 1, vec![Act::Ok; 20]).await;
    let (a, b) = tokio::join!(outbox.purge_expired(), outbox.purge_expired());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        (a.deliveries + b.deliveries) as i64,
        completed_old,
        "{label}: every old completed delivery is purged once ({a:?}, {b:?})"
    );
    assert_eq!(
        a.events + b.events,
        30,
        "{label}: the 30 old events nothing refers to"
    );
    assert!(
        a.steps + b.steps >= (completed_old as u64).div_ceil(7),
        "{label}: at most 7 rows a statement ({a:?}, {b:?})"
    );
    assert_eq!(
        count(&store, waiting).await,
        waiting_before,
        "{label}: pending, leased and dead deliveries are kept"
    );
    assert_eq!(count(&store, letters).await, letters_before, "{label}");
    for id in dead.iter().chain(&pending).chain(&leased) {
        let kept = scalar(
            &store,
            "SELECT COUNT(*) FROM event_outbox WHERE event_id = $1",
            &[SqlValue::Text(&id.to_string())],
        )
        .await;
        assert_eq!(kept, 1, "{label}: event {id} still referred to is kept");
    }
    assert!(
        status_is(&store, "engine.ext2", pending[0], "pending").await,
        "{label}"
    );

    // Deliveries flowed meanwhile; the leased one finishes once its handler may.
    calls.open_gate();
    store.resume_destination("engine.ext2").await.unwrap();
    workers.shutdown(Duration::from_secs(30)).await.unwrap();
    outbox.drain(DRAIN).await.unwrap();
    for id in fresh.iter().chain(&leased) {
        assert!(
            status_is(&store, "engine.ext", *id, "completed").await,
            "{label}"
        );
    }

    // The de-duplication window: an event id purged from the outbox is new again.
    let again = Envelope::new(Ticked {
        stream: "old".into(),
        n: 100,
        act: Act::Ok,
    })
    .with_id(old[0])
    .with_sequence(100);
    let before = calls.of_in("ext", old[0]);
    let mut uow = outbox.begin().await.unwrap();
    uow.add(again);
    uow.commit().await.unwrap();
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(
        calls.of_in("ext", old[0]),
        before + 1,
        "{label}: delivered again after its outbox row was purged"
    );
}
