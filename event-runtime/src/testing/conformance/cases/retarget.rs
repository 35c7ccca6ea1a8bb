//! What handlers replaced by an event union leave in the store — pending deliveries and dead
//! letters no worker claims — purged, or re-targeted onto the union's handler: merged into
//! its runs per aggregate in sequence order with one ready head each, duplicates (events the
//! new handler has already) dropped, audited; refused for a registered old handler, an
//! unregistered new one, and an old one a live worker still holds.

use event_core::{event_handler, DomainEvent, Envelope, EventRecorder, EventUnion, HandlerError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::outbox::{count, fast_retries, setup, DRAIN};
use super::{Capability, Case};
use crate::{
    DeadLetterFilter, Dispatcher, Outbox, OutboxError, Resolution, SqlValue, Store, StoreError, Tx,
};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "ledger.opened", version = 1, crate = crate::testing::conformance::unregistered)]
pub(crate) struct Opened {
    #[event(aggregate_id)]
    pub(crate) account: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "ledger.credited", version = 1, crate = crate::testing::conformance::unregistered)]
pub(crate) struct Credited {
    #[event(aggregate_id)]
    pub(crate) account: String,
    /// The old handler refuses it for good.
    pub(crate) refused: bool,
}

#[derive(Debug, EventUnion)]
pub(crate) enum LedgerEvent {
    Opened(Opened),
    Credited(Credited),
}

async fn effect(
    tx: &mut Tx,
    handler: &str,
    id: Uuid,
    account: &str,
    seq: u64,
) -> Result<(), HandlerError> {
    tx.execute(
        "INSERT INTO effects (event_id, handler, aggregate, seq) VALUES ($1, $2, $3, $4)",
        &[
            SqlValue::Text(&id.to_string()),
            SqlValue::Text(handler),
            SqlValue::Text(account),
            SqlValue::Int(seq as i64),
        ],
    )
    .await?;
    Ok(())
}

/// The release before: one handler per event type.
#[event_handler(name = "retarget.old_opened", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn old_opened(e: &Envelope<Opened>, tx: &mut Tx) -> Result<(), HandlerError> {
    effect(tx, "old_opened", e.id(), &e.event().account, e.sequence()).await
}

#[event_handler(name = "retarget.old_credited", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn old_credited(e: &Envelope<Credited>, tx: &mut Tx) -> Result<(), HandlerError> {
    if e.event().refused {
        return Err(HandlerError::permanent_msg("the old ledger refuses it"));
    }
    effect(tx, "old_credited", e.id(), &e.event().account, e.sequence()).await
}

/// The release after: one handler for the whole stream.
#[event_handler(name = "retarget.summary", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn summary(e: &Envelope<LedgerEvent>, tx: &mut Tx) -> Result<(), HandlerError> {
    let account = match e.event() {
        LedgerEvent::Opened(o) => &o.account,
        LedgerEvent::Credited(c) => &c.account,
    };
    effect(tx, "summary", e.id(), account, e.sequence()).await
}

const OLD_OPENED: &str = "retarget.old_opened";
const OLD_CREDITED: &str = "retarget.old_credited";
const SUMMARY: &str = "retarget.summary";

async fn outbox_with(db: &Case, store: &Store, dispatcher: crate::DispatcherBuilder) -> Outbox {
    setup(store, db).await;
    Outbox::builder(store.clone())
        .dispatcher(dispatcher)
        .config(fast_retries())
        .build()
        .unwrap()
}

/// One aggregate's events, sequenced from 1: `Some(refused)` a credit, `None` an opening.
async fn commit(outbox: &Outbox, account: &str, events: &[Option<bool>]) -> Vec<Uuid> {
    let mut uow = outbox.begin().await.unwrap();
    let mut recorder = EventRecorder::new();
    for e in events {
        match e {
            None => {
                recorder.record(Opened {
                    account: account.into(),
                });
            }
            Some(refused) => {
                recorder.record(Credited {
                    account: account.into(),
                    refused: *refused,
                });
            }
        }
    }
    let ids = recorder.pending().iter().map(|e| e.metadata().id).collect();
    uow.extend(recorder.take());
    uow.commit().await.unwrap();
    ids
}

/// The sequences `handler` applied for `account`, in the order it applied them.
async fn applied(store: &Store, handler: &str, account: &str) -> Vec<i64> {
    store
        .query("SELECT seq FROM effects WHERE handler = $1 AND aggregate = $2 ORDER BY id")
        .bind(handler)
        .bind(account)
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<i64>("seq").unwrap())
        .collect()
}

/// (status, ready) of `handler`'s delivery of `id`.
async fn delivery(store: &Store, handler: &str, id: Uuid) -> Option<(String, bool)> {
    store
        .query("SELECT status, ready FROM event_deliveries WHERE handler = $1 AND event_id = $2")
        .bind(handler)
        .bind(id.to_string())
        .fetch_optional()
        .await
        .unwrap()
        .map(|r| (r.get("status").unwrap(), r.get("ready").unwrap()))
}

pub async fn purging_an_unregistered_handler_removes_only_its_rows_and_is_audited(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let label = db.label();
    let store = db.open().await;
    if !db.needs(
        &store,
        &[
            Capability::Inspection,
            Capability::DestinationOperations,
            Capability::OperationLog,
        ],
    ) {
        return;
    }
    let before = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty()
            .handler::<old_credited>()
            .handler::<summary>(),
    )
    .await;
    // p: the old handler's credit 2 is dead and holds back credit 3; the union has all three.
    commit(&before, "p", &[None, Some(true), Some(false)]).await;
    before.drain(DRAIN).await.unwrap();
    // q: pending for both.
    let q = commit(&before, "q", &[Some(false)]).await;

    let after = outbox_with(db, &store, Dispatcher::builder_empty().handler::<summary>()).await;
    let left = after.unregistered_destinations().await.unwrap();
    assert_eq!(
        left.iter()
            .map(|h| (h.handler.as_str(), h.pending, h.dead))
            .collect::<Vec<_>>(),
        [(OLD_CREDITED, 2, 1)],
        "{label}"
    );
    let report = after
        .purge_unregistered(OLD_CREDITED, "ops", "replaced by the summary")
        .await
        .unwrap();
    assert_eq!(
        (report.deliveries, report.dead_letters, report.duplicates),
        (2, 1, 0),
        "{label}"
    );
    assert_eq!(report.audit.action, "handler-purge");
    assert_eq!(
        (report.audit.actor.as_str(), report.audit.count),
        ("ops", 3)
    );
    assert_eq!(report.audit.reason, "replaced by the summary");
    assert!(report.audit.finished_at.is_some(), "{label}");
    assert_eq!(
        store.audit_log(1).await.unwrap()[0],
        report.audit,
        "{label}"
    );

    // Only the old handler's rows changed.
    let stats = store.stats().await.unwrap();
    let of = |name: &str| stats.handlers.iter().find(|h| h.handler == name).unwrap();
    assert_eq!(
        (
            of(OLD_CREDITED).pending,
            of(OLD_CREDITED).dead,
            of(OLD_CREDITED).purged
        ),
        (0, 0, 3),
        "{label}"
    );
    assert_eq!(
        (of(SUMMARY).pending, of(SUMMARY).completed),
        (1, 3),
        "{label}"
    );
    assert!(after.unregistered_destinations().await.unwrap().is_empty());
    let all = DeadLetterFilter {
        include_resolved: true,
        ..DeadLetterFilter::default()
    };
    let dead = store.dead_letters(&all).await.unwrap();
    assert_eq!(dead.len(), 1, "{label}");
    assert_eq!(dead[0].resolution.as_deref(), Some("purged"), "{label}");
    assert_eq!(
        delivery(&store, SUMMARY, q[0]).await,
        Some(("pending".into(), true)),
        "{label}: the union's own delivery is untouched"
    );
    after.drain(DRAIN).await.unwrap();
    assert_eq!(applied(&store, "summary", "q").await, [1], "{label}");
    // Nothing is left to do: a second purge finds nothing and writes a row that says so.
    let again = after
        .purge_unregistered(OLD_CREDITED, "ops", "again")
        .await
        .unwrap();
    assert_eq!(
        (again.deliveries, again.dead_letters, again.audit.count),
        (0, 0, 0)
    );
}

pub async fn retargeting_onto_a_union_handler_merges_runs_in_order_and_skips_duplicates(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let label = db.label();
    let store = db.open().await;
    if !db.needs(
        &store,
        &[
            Capability::Inspection,
            Capability::DeadLetterOperations,
            Capability::DestinationOperations,
            Capability::OperationLog,
        ],
    ) {
        return;
    }
    let before = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty()
            .handler::<old_opened>()
            .handler::<old_credited>(),
    )
    .await;
    // a: opened (delivered), credit 2 dead, credit 3 pending behind it.
    let a = commit(&before, "a", &[None, Some(true), Some(false)]).await;
    before.drain(DRAIN).await.unwrap();
    // b: both pending, one for each old handler.
    let b = commit(&before, "b", &[None, Some(false)]).await;
    // c: committed during the rolling deploy, when the old credit handler and the union ran
    // side by side: c's credit is a duplicate.
    let mid = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty()
            .handler::<old_credited>()
            .handler::<summary>(),
    )
    .await;
    let c = commit(&mid, "c", &[None, Some(false)]).await;

    let after = outbox_with(db, &store, Dispatcher::builder_empty().handler::<summary>()).await;
    let credited = after
        .retarget_unregistered(OLD_CREDITED, SUMMARY, "ops", "replaced by the summary")
        .await
        .unwrap();
    assert_eq!(
        (
            credited.deliveries,
            credited.dead_letters,
            credited.duplicates
        ),
        (2, 1, 1),
        "{label}: a3 and b2 moved, a2 moved with its dead letter, c2 dropped"
    );
    assert_eq!(
        (credited.audit.action.as_str(), credited.audit.count),
        ("handler-retarget", 4)
    );
    assert_eq!(
        delivery(&store, SUMMARY, b[1]).await,
        Some(("pending".into(), true)),
        "{label}: b2 heads b's run of the union"
    );
    // old_opened's b1 comes before b2: it takes the head.
    let opened = after
        .retarget_unregistered(OLD_OPENED, SUMMARY, "ops", "replaced by the summary")
        .await
        .unwrap();
    assert_eq!(
        (opened.deliveries, opened.dead_letters, opened.duplicates),
        (1, 0, 0),
        "{label}: a1 was delivered already and stays the old handler's"
    );
    for (id, expected, what) in [
        (a[1], ("dead", true), "a2: the dead head of a's run"),
        (a[2], ("pending", false), "a3: behind the dead letter"),
        (b[0], ("pending", true), "b1: the new head"),
        (b[1], ("pending", false), "b2: no longer the head"),
        (c[0], ("pending", true), "c1"),
        (c[1], ("pending", false), "c2"),
    ] {
        let got = delivery(&store, SUMMARY, id).await.unwrap();
        assert_eq!((got.0.as_str(), got.1), expected, "{label}: {what}");
    }
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM event_deliveries WHERE handler = $1 AND status IN ('pending', 'dead')",
            &[SqlValue::Text(OLD_CREDITED)]
        )
        .await,
        0,
        "{label}"
    );
    assert!(after.unregistered_destinations().await.unwrap().is_empty());

    // The union delivers what moved, per aggregate in sequence order, the duplicate once.
    after.drain(DRAIN).await.unwrap();
    assert_eq!(applied(&store, "summary", "b").await, [1, 2], "{label}");
    assert_eq!(applied(&store, "summary", "c").await, [1, 2], "{label}");
    assert_eq!(
        applied(&store, "old_credited", "c").await,
        Vec::<i64>::new()
    );
    assert!(applied(&store, "summary", "a").await.is_empty(), "{label}");
    // a's dead letter moved with its delivery: replayed, it reaches the union, then credit 3.
    let dead = store
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{label}");
    assert_eq!(
        (dead[0].handler.as_str(), dead[0].event_id),
        (SUMMARY, a[1])
    );
    assert_eq!(dead[0].held_back, 1, "{label}");
    store
        .resolve_dead_letters(
            &[dead[0].id],
            Resolution::Replay,
            "ops",
            "the union takes it",
        )
        .await
        .unwrap();
    after.drain(DRAIN).await.unwrap();
    assert_eq!(applied(&store, "summary", "a").await, [2, 3], "{label}");
}

pub async fn purging_or_retargeting_is_refused_for_live_or_unknown_handlers(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let label = db.label();
    let store = db.open().await;
    if !db.needs(
        &store,
        &[Capability::Inspection, Capability::DestinationOperations],
    ) {
        return;
    }
    let before = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty().handler::<old_credited>(),
    )
    .await;
    commit(&before, "r", &[Some(false), Some(false)]).await;
    let after = outbox_with(db, &store, Dispatcher::builder_empty().handler::<summary>()).await;

    let e = after
        .purge_unregistered(SUMMARY, "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, OutboxError::Registered { destination } if destination == SUMMARY),
        "{label}: {e}"
    );
    let e = before
        .retarget_unregistered(OLD_CREDITED, SUMMARY, "ops", "x")
        .await
        .unwrap_err();
    assert!(matches!(&e, OutboxError::Registered { .. }), "{label}: {e}");
    let e = after
        .retarget_unregistered(OLD_CREDITED, "retarget.nosuch", "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, OutboxError::NotRegistered { destination, known } if destination == "retarget.nosuch" && known == SUMMARY),
        "{label}: {e}"
    );
    // A handler of other events only: the credits would just be dead-lettered there.
    let other = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty()
            .handler::<summary>()
            .handler::<old_opened>(),
    )
    .await;
    let e = other
        .retarget_unregistered(OLD_CREDITED, "retarget.old_opened", "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, OutboxError::TakesOtherEvents { destination, events } if destination == "retarget.old_opened" && events == "ledger.credited"),
        "{label}: {e}"
    );
    let e = store
        .retarget_destination(OLD_CREDITED, OLD_CREDITED, true, "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::SameDestination { .. }),
        "{label}: {e}"
    );

    // Another process that still has the old handler holds one of its deliveries.
    let now = chrono::Utc::now().timestamp_millis();
    store
        .query("INSERT INTO event_leases (token, owner, acquired_at, expires_at) VALUES ($1, $2, $3, $4)")
        .bind("retarget-live")
        .bind("another process")
        .bind(now)
        .bind(now + 3_600_000)
        .execute()
        .await
        .unwrap();
    store
        .query("UPDATE event_deliveries SET lease_token = $1 WHERE handler = $2")
        .bind("retarget-live")
        .bind(OLD_CREDITED)
        .execute()
        .await
        .unwrap();
    let e = after
        .purge_unregistered(OLD_CREDITED, "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            OutboxError::Store(StoreError::DestinationInUse { leased: 2, .. })
        ),
        "{label}: {e}"
    );
    let e = after
        .retarget_unregistered(OLD_CREDITED, SUMMARY, "ops", "x")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, OutboxError::Store(StoreError::DestinationInUse { .. })),
        "{label}: {e}"
    );
    let pending = count(
        &store,
        "SELECT COUNT(*) FROM event_deliveries WHERE status = 'pending'",
        &[],
    )
    .await;
    assert_eq!(pending, 2, "{label}: nothing was changed");
    assert!(
        store.audit_log(10).await.unwrap().is_empty(),
        "{label}: nothing was audited"
    );
}

pub async fn retargeting_in_pages_resumes_after_an_interruption_with_one_head_per_run(db: &Case) {
    use crate::store::backend::{AuditStamp, DestinationOperation};
    if db.effects_table().is_none() {
        return;
    }
    let label = db.label();
    let store = db.open().await;
    if !db.needs(
        &store,
        &[
            Capability::Inspection,
            Capability::DestinationOperations,
            Capability::OperationLog,
        ],
    ) {
        return;
    }
    let before = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty().handler::<old_credited>(),
    )
    .await;
    // 3 aggregates of 350 credits each: 1,050 deliveries, three pages.
    for account in ["x", "y", "z"] {
        commit(&before, account, &[Some(false); 350]).await;
    }
    let after = outbox_with(db, &store, Dispatcher::builder_empty().handler::<summary>()).await;

    // A re-target that stopped after its first page (a crash between two transactions).
    let op = DestinationOperation {
        from: OLD_CREDITED.into(),
        to: Some(SUMMARY.into()),
        ordered: true,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let operations = store
        .destination_operations()
        .expect("the backend offers DestinationOperations");
    let stamp = AuditStamp {
        actor: "ops",
        reason: "replaced by the summary",
        at: now,
    };
    let started = operations
        .start_destination_operation(&op, &stamp)
        .await
        .unwrap();
    let first = operations
        .destination_page(started.id, &op, crate::store::RESOLVE_PAGE, now)
        .await
        .unwrap();
    assert_eq!((first.selected, first.deliveries), (500, 500), "{label}");
    let unfinished = store.audit_log(1).await.unwrap().remove(0);
    assert_eq!(
        (unfinished.count, unfinished.finished_at),
        (500, None),
        "{label}"
    );

    // The same request finishes it under the same audit row.
    let report = after
        .retarget_unregistered(OLD_CREDITED, SUMMARY, "ops", "replaced by the summary")
        .await
        .unwrap();
    assert_eq!(report.audit.id, started.id, "{label}");
    assert_eq!(
        (report.deliveries, report.audit.count),
        (550, 1_050),
        "{label}"
    );
    assert!(report.audit.finished_at.is_some(), "{label}");
    assert_eq!(store.audit_log(10).await.unwrap().len(), 1, "{label}");

    // One ready head per run: the lowest sequence of each aggregate.
    let heads = store
        .query(
            "SELECT aggregate_id, sequence FROM event_deliveries \
             WHERE handler = $1 AND status = 'pending' AND ready ORDER BY aggregate_id",
        )
        .bind(SUMMARY)
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<String>("aggregate_id").unwrap(),
                r.get::<i64>("sequence").unwrap(),
            )
        })
        .collect::<Vec<_>>();
    assert_eq!(
        heads,
        [
            ("x".to_owned(), 1),
            ("y".to_owned(), 1),
            ("z".to_owned(), 1)
        ],
        "{label}"
    );
    after.drain(DRAIN).await.unwrap();
    for account in ["x", "y", "z"] {
        assert_eq!(
            applied(&store, "summary", account).await,
            (1..=350).collect::<Vec<i64>>(),
            "{label}: {account} in sequence order"
        );
    }
}

/// Unordered: every delivery is a run of its own.
#[event_handler(name = "retarget.export", unordered, crate = crate::testing::conformance::unregistered)]
pub(crate) async fn export(e: &Envelope<LedgerEvent>, tx: &mut Tx) -> Result<(), HandlerError> {
    let account = match e.event() {
        LedgerEvent::Opened(o) => &o.account,
        LedgerEvent::Credited(c) => &c.account,
    };
    effect(tx, "export", e.id(), account, e.sequence()).await
}

pub async fn retargeting_onto_an_unordered_handler_makes_each_delivery_ready(db: &Case) {
    if db.effects_table().is_none() {
        return;
    }
    let label = db.label();
    let store = db.open().await;
    if !db.needs(
        &store,
        &[
            Capability::Inspection,
            Capability::DestinationOperations,
            Capability::OperationLog,
        ],
    ) {
        return;
    }
    let before = outbox_with(
        db,
        &store,
        Dispatcher::builder_empty().handler::<old_credited>(),
    )
    .await;
    let ids = commit(&before, "u", &[Some(false), Some(false), Some(false)]).await;
    let after = outbox_with(db, &store, Dispatcher::builder_empty().handler::<export>()).await;
    let report = after
        .retarget_unregistered(OLD_CREDITED, "retarget.export", "ops", "exported instead")
        .await
        .unwrap();
    assert_eq!(report.deliveries, 3, "{label}");
    for id in &ids {
        let row = store
            .query(
                "SELECT sequence, ready FROM event_deliveries WHERE handler = $1 AND event_id = $2",
            )
            .bind("retarget.export")
            .bind(id.to_string())
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<i64>("sequence").unwrap(),
                row.get::<bool>("ready").unwrap()
            ),
            (0, true),
            "{label}: a run of its own"
        );
    }
    after.drain(DRAIN).await.unwrap();
    assert_eq!(applied(&store, "export", "u").await.len(), 3, "{label}");
}
