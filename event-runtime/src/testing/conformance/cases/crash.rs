//! Conformance cases of crash safety, proven with fault injection (feature
//! `fault-injection`): the runtime is stopped — as a killed process would stop, or by
//! killing its database connection — before COMMIT, after COMMIT, during a handler, and after
//! the handlers before completion is recorded. After a restart on the same database, every
//! accepted event's effects are applied exactly once and nothing accepted is lost.
//!
//! They run only with this crate's feature `fault-injection`; without it each case says it is
//! skipped.

use super::Case;

#[cfg(not(feature = "fault-injection"))]
const NO_FAULTS: &str = "event-runtime's feature `fault-injection` is off";

pub async fn crash_before_commit(db: &Case) {
    #[cfg(feature = "fault-injection")]
    injected::run(db, crate::testing::FaultPoint::BeforeCommit).await;
    #[cfg(not(feature = "fault-injection"))]
    db.skipped(NO_FAULTS);
}

pub async fn crash_after_commit_before_delivery(db: &Case) {
    #[cfg(feature = "fault-injection")]
    injected::run(db, crate::testing::FaultPoint::AfterCommit).await;
    #[cfg(not(feature = "fault-injection"))]
    db.skipped(NO_FAULTS);
}

pub async fn crash_during_a_handler(db: &Case) {
    #[cfg(feature = "fault-injection")]
    injected::run(db, crate::testing::FaultPoint::DuringHandler).await;
    #[cfg(not(feature = "fault-injection"))]
    db.skipped(NO_FAULTS);
}

pub async fn crash_after_the_handlers_before_completion(db: &Case) {
    #[cfg(feature = "fault-injection")]
    injected::run(db, crate::testing::FaultPoint::AfterHandler).await;
    #[cfg(not(feature = "fault-injection"))]
    db.skipped(NO_FAULTS);
}

#[cfg(feature = "fault-injection")]
mod injected {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::Case;
    use crate::{
        testing::{FaultAction, FaultPoint},
        Dispatcher, Outbox, OutboxConfig, OutboxError, SqlValue, Store, Tx,
    };
    use event_core::{event_handler, DomainEvent, Envelope, EventRecorder, HandlerError};
    use serde::{Deserialize, Serialize};
    use uuid::Uuid;

    #[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
    #[event(name = "stock.received", version = 1, crate = crate::testing::conformance::unregistered)]
    struct Received {
        #[event(aggregate_id)]
        sku: String,
        quantity: i64,
    }

    /// Adds to the stock level and logs its effect, in the delivery's transaction.
    #[event_handler(name = "stock_level", crate = crate::testing::conformance::unregistered)]
    async fn stock_level(envelope: &Envelope<Received>, tx: &mut Tx) -> Result<(), HandlerError> {
        let e = envelope.event();
        tx.execute(
            "INSERT INTO stock_effects (event_id, sku, quantity) VALUES ($1, $2, $3)",
            &[
                SqlValue::Text(&envelope.id().to_string()),
                SqlValue::Text(&e.sku),
                SqlValue::Int(e.quantity),
            ],
        )
        .await?;
        Ok(())
    }

    async fn setup(store: &Store) {
        let mut tx = store.begin().await.unwrap();
        tx.execute(
            "CREATE TABLE IF NOT EXISTS stock_effects (event_id TEXT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
            &[],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }

    fn config() -> OutboxConfig {
        OutboxConfig::default()
            .lease(Duration::from_secs(1))
            .batch_size(4)
    }

    async fn outbox(store: Store, fault: Option<(FaultPoint, FaultAction)>) -> Outbox {
        setup(&store).await;
        let builder = Outbox::builder(store)
            .dispatcher(Dispatcher::builder_empty().handler::<stock_level>())
            .config(config());
        let builder = match fault {
            None => builder,
            Some((point, action)) => {
                let fired = Arc::new(AtomicBool::new(false));
                builder.fault_injection(move |p| {
                    if p == point && !fired.swap(true, Ordering::SeqCst) {
                        action
                    } else {
                        FaultAction::Continue
                    }
                })
            }
        };
        builder.build().unwrap()
    }

    /// Commits three events for `sku`; returns their ids and whether the commit reported success.
    async fn commit(outbox: &Outbox, sku: &str) -> (Vec<Uuid>, Result<(), OutboxError>) {
        let mut recorder = EventRecorder::new();
        for q in 1..=3 {
            recorder.record(Received {
                sku: sku.into(),
                quantity: q,
            });
        }
        let ids = recorder.pending().iter().map(|e| e.metadata().id).collect();
        let result = async {
            let mut uow = outbox.begin().await?;
            uow.extend(recorder.take());
            uow.commit().await.map(|_| ())
        }
        .await;
        (ids, result)
    }

    async fn scalar(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
        let mut tx = store.begin().await.unwrap();
        let n = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(0);
        tx.commit().await.unwrap();
        n
    }

    async fn in_outbox(store: &Store, id: Uuid) -> bool {
        scalar(
            store,
            "SELECT COUNT(*) FROM event_outbox WHERE event_id = $1",
            &[SqlValue::Text(&id.to_string())],
        )
        .await
            == 1
    }

    async fn effects(store: &Store, id: Uuid) -> i64 {
        scalar(
            store,
            "SELECT COUNT(*) FROM stock_effects WHERE event_id = $1",
            &[SqlValue::Text(&id.to_string())],
        )
        .await
    }

    /// Runs three commits and a drain with the fault armed, then "restarts" on a new connection
    /// pool and drains again; checks exactly-once effects of every accepted event.
    async fn crash_and_recover(db: &Case, point: FaultPoint, action: FaultAction) {
        let label = format!("{} {point:?} {action:?}", db.label());
        let prefix = format!("{action:?}-");
        let crashing = outbox(db.open().await, Some((point, action))).await;
        let mut all = Vec::new();
        let mut crashed = false;
        for sku in ["a", "b", "c"] {
            let (ids, result) = commit(&crashing, &format!("{prefix}{sku}")).await;
            match result {
                Ok(()) => {}
                Err(OutboxError::Injected(p)) => {
                    assert_eq!(p, point, "{label}");
                    crashed = true;
                }
                Err(e) => panic!("{label}: {e}"),
            }
            all.extend(ids);
        }
        match crashing.drain(Duration::from_secs(30)).await {
            Ok(_) => {}
            Err(OutboxError::Injected(p)) => {
                assert_eq!(p, point, "{label}");
                crashed = true;
            }
            Err(e) => panic!("{label}: {e}"),
        }
        assert!(crashed, "{label}: the fault never fired");
        drop(crashing);

        // Restart: a new process on the same database.
        let restarted = outbox(db.open().await, None).await;
        restarted.drain(Duration::from_secs(30)).await.unwrap();
        let store = restarted.store();
        let mut accepted = 0;
        for id in &all {
            if in_outbox(store, *id).await {
                accepted += 1;
                assert_eq!(effects(store, *id).await, 1, "{label}: event {id}");
            } else {
                assert_eq!(
                    effects(store, *id).await,
                    0,
                    "{label}: event {id} was never accepted"
                );
            }
        }
        let expected = if point == FaultPoint::BeforeCommit {
            6
        } else {
            9
        };
        assert_eq!(accepted, expected, "{label}");
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.pending, stats.dead_letters), (0, 0), "{label}");
        let total = scalar(
            store,
            "SELECT COUNT(*) FROM stock_effects WHERE sku LIKE $1",
            &[SqlValue::Text(&format!("{prefix}%"))],
        )
        .await;
        assert_eq!(total, expected as i64, "{label}: no duplicate effects");
    }

    /// Each fault point, as a killed process (the transaction abandoned) and as a killed database
    /// connection under it.
    pub(super) async fn run(db: &Case, point: FaultPoint) {
        crash_and_recover(db, point, FaultAction::Crash).await;
        crash_and_recover(db, point, FaultAction::DropConnection).await;
    }
}
