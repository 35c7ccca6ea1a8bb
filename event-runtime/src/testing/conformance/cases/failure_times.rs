//! Conformance case: the failure time recorded for a delivery is when its handler failed, not
//! when the outcome was written, so that a retry is never due before its recorded failure
//! however late the settling is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use serde::{Deserialize, Serialize};

use super::Case;
use crate::{Dispatcher, Outbox, RetryPolicy, SqlValue, Store};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "times.failed", version = 1, crate = crate::testing::conformance::unregistered)]
pub(crate) struct Failed {
    #[event(aggregate_id)]
    pub(crate) stream: String,
    /// The first attempt of this event holds the deliveries' write lock for a second from
    /// another transaction before it fails: the settling of every outcome is delayed.
    pub(crate) locks: bool,
}

/// Takes the database's write lock on the deliveries from a transaction of its own.
pub(crate) struct Locker {
    store: Store,
    /// The backend's statements that take it.
    lock: &'static [&'static str],
    locked: AtomicBool,
}

impl Locker {
    /// Holds the lock for `hold` in the background; returns once it is taken.
    async fn hold(&self, hold: Duration) {
        let (store, lock) = (self.store.clone(), self.lock);
        let (taken, held) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            // None where beginning a transaction takes the write lock (SQLite: IMMEDIATE).
            let mut tx = store.begin().await.unwrap();
            for &sql in lock {
                tx.execute(sql, &[]).await.unwrap();
            }
            let _ = taken.send(());
            tokio::time::sleep(hold).await;
            tx.rollback().await.unwrap();
        });
        held.await.unwrap();
    }
}

#[event_handler(name = "times.ext", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn fails(e: &Envelope<Failed>, locker: &Locker) -> Result<(), HandlerError> {
    if e.event().locks && !locker.locked.swap(true, Ordering::SeqCst) {
        locker.hold(Duration::from_millis(1_000)).await;
    } else {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(HandlerError::transient_msg(
        "the downstream service is down",
    ))
}

pub async fn a_retry_is_never_due_before_its_recorded_failure(db: &Case) {
    let Some(lock) = db.lock_deliveries() else {
        return;
    };
    let store = db.open().await;
    let locker = Arc::new(Locker {
        store: db.open().await,
        lock,
        locked: AtomicBool::new(false),
    });
    let outbox = Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<fails>())
        .resource_arc(Arc::clone(&locker))
        .config(super::engine::fast().retry(RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }))
        .build()
        .unwrap();
    let mut uow = outbox.begin().await.unwrap();
    for i in 0..6 {
        uow.add(
            Envelope::new(Failed {
                stream: format!("s{i}"),
                locks: i == 0,
            })
            .with_sequence(1),
        );
    }
    uow.commit().await.unwrap();
    // One batch: the first failure's outcome waits a second for the lock; the others fail
    // meanwhile and are recorded after it.
    let report = outbox.deliver_batch().await.unwrap();
    assert_eq!(report.retried, 6, "{}: {report:?}", db.label());
    let mut tx = store.begin().await.unwrap();
    let early = tx
        .fetch_i64(
            "SELECT COUNT(*) FROM event_deliveries WHERE handler = $1 AND next_attempt_at < last_failed_at",
            &[SqlValue::Text("times.ext")],
        )
        .await
        .unwrap()
        .unwrap_or(-1);
    let failed = tx
        .fetch_i64(
            "SELECT COUNT(*) FROM event_deliveries WHERE handler = $1 AND last_failed_at IS NOT NULL",
            &[SqlValue::Text("times.ext")],
        )
        .await
        .unwrap()
        .unwrap_or(-1);
    tx.rollback().await.unwrap();
    assert_eq!(failed, 6, "{}: every failure recorded", db.label());
    assert_eq!(
        early,
        0,
        "{}: a retry was due before its recorded failure",
        db.label()
    );
}
