//! Conformance cases of the delivery engine with handlers services really have: slower than
//! the lease, without a transaction (HTTP, mail), over their time limit, failing with text a
//! database refuses; hot aggregates; paused and unavailable destinations; shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use event_core::{event_handler, DomainEvent, Envelope, EventDescriptor, HandlerError};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use super::{Capability, Case};
use crate::{
    CancellationToken, DeadLetterFilter, Delivery, DeliveryError, Destination, Dispatcher,
    HandlerOptions, Outbox, OutboxConfig, OutboxError, RetryPolicy, Routing, SqlValue, Store,
    StoreError, Tx,
};

/// What a handler does with one event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Act {
    Ok,
    /// Sleeps this long, every attempt.
    Sleep(u64),
    /// Sleeps this long on the first attempt only.
    SleepOnce(u64),
    /// Waits for the gate to open, on the first attempt only.
    Gate,
    /// Fails transiently, every attempt.
    Fail,
    /// Fails permanently with this message.
    Refuse(String),
    /// Runs a statement that would take far longer than any time limit, on the first attempt.
    LongStatement,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "engine.ticked", version = 1, crate = crate::testing::conformance::unregistered)]
pub(crate) struct Ticked {
    #[event(aggregate_id)]
    pub(crate) stream: String,
    pub(crate) n: u64,
    pub(crate) act: Act,
}

/// What the handlers saw.
#[derive(Default)]
pub(crate) struct Calls {
    /// Calls per (handler, event id).
    calls: Mutex<HashMap<(&'static str, Uuid), u32>>,
    /// Order of first calls per stream.
    order: Mutex<HashMap<String, Vec<u64>>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    /// Streams with a call in progress, to catch two at once within one aggregate.
    busy: Mutex<HashMap<String, usize>>,
    overlap_within_aggregate: AtomicBool,
    started: Notify,
    gate: Notify,
    gate_open: AtomicBool,
    /// The backend's statement that runs for minutes, for [`Act::LongStatement`].
    long_statement: Option<&'static str>,
}

impl Calls {
    /// Calls of every handler for event `id`.
    pub(crate) fn of(&self, id: Uuid) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|((_, e), _)| *e == id)
            .map(|(_, n)| n)
            .sum()
    }

    /// Calls of `handler` for event `id`.
    pub(crate) fn of_in(&self, handler: &str, id: Uuid) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|((h, e), _)| *e == id && *h == handler)
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn order(&self, stream: &str) -> Vec<u64> {
        self.order
            .lock()
            .unwrap()
            .get(stream)
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn max_running(&self) -> usize {
        self.max_running.load(Ordering::SeqCst)
    }

    pub(crate) fn open_gate(&self) {
        self.gate_open.store(true, Ordering::SeqCst);
        self.gate.notify_waiters();
    }

    /// Waits until some handler call has started.
    pub(crate) async fn started(&self) {
        tokio::time::timeout(Duration::from_secs(20), self.started.notified())
            .await
            .expect("a handler started");
    }

    /// Records the start of a call; returns its attempt number for this event.
    fn enter(&self, handler: &'static str, e: &Envelope<Ticked>) -> u32 {
        let attempt = {
            let mut m = self.calls.lock().unwrap();
            let n = m.entry((handler, e.id())).or_default();
            *n += 1;
            *n
        };
        if attempt == 1 {
            self.order
                .lock()
                .unwrap()
                .entry(e.event().stream.clone())
                .or_default()
                .push(e.event().n);
        }
        {
            let mut busy = self.busy.lock().unwrap();
            let b = busy.entry(e.event().stream.clone()).or_default();
            *b += 1;
            if *b > 1 {
                self.overlap_within_aggregate.store(true, Ordering::SeqCst);
            }
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        // A permit, not a wake-up: a handler that starts before the test waits for it is not
        // missed (with `notify_waiters` the test waited 20 s for a start that had happened).
        self.started.notify_one();
        attempt
    }

    fn leave(&self, e: &Envelope<Ticked>) {
        self.running.fetch_sub(1, Ordering::SeqCst);
        *self
            .busy
            .lock()
            .unwrap()
            .entry(e.event().stream.clone())
            .or_default() -= 1;
    }

    async fn act(&self, e: &Envelope<Ticked>, attempt: u32) -> Result<(), HandlerError> {
        match &e.event().act {
            Act::Ok | Act::LongStatement => Ok(()),
            Act::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok(())
            }
            Act::SleepOnce(ms) if attempt == 1 => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok(())
            }
            Act::SleepOnce(_) => Ok(()),
            Act::Gate if attempt == 1 => {
                while !self.gate_open.load(Ordering::SeqCst) {
                    let _ =
                        tokio::time::timeout(Duration::from_millis(50), self.gate.notified()).await;
                }
                Ok(())
            }
            Act::Gate => Ok(()),
            Act::Fail => Err(HandlerError::transient_msg("downstream unavailable")),
            Act::Refuse(m) => Err(HandlerError::permanent_msg(m)),
        }
    }
}

/// Takes the transaction: writes its effect, then acts.
#[event_handler(name = "engine.tx", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn in_tx(
    e: &Envelope<Ticked>,
    tx: &mut Tx,
    calls: &Calls,
) -> Result<(), HandlerError> {
    let attempt = calls.enter("tx", e);
    tx.execute(
        "INSERT INTO engine_effects (event_id, handler) VALUES ($1, 'tx')",
        &[SqlValue::Text(&e.id().to_string())],
    )
    .await?;
    let result = if e.event().act == Act::LongStatement && attempt == 1 {
        long_statement(tx, calls).await
    } else {
        calls.act(e, attempt).await
    };
    calls.leave(e);
    result
}

/// Takes no transaction (an HTTP call, a mail): acts.
#[event_handler(name = "engine.ext", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn external(e: &Envelope<Ticked>, calls: &Calls) -> Result<(), HandlerError> {
    let attempt = calls.enter("ext", e);
    let result = calls.act(e, attempt).await;
    calls.leave(e);
    result
}

/// A second handler without a transaction, to show that one destination's trouble leaves the
/// others alone.
#[event_handler(name = "engine.ext2", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn external2(_: &Envelope<Ticked>) -> Result<(), HandlerError> {
    Ok(())
}

async fn long_statement(tx: &mut Tx, calls: &Calls) -> Result<(), HandlerError> {
    // Minutes of work for the database, whichever it is.
    let sql = calls
        .long_statement
        .expect("the case gives the backend's long statement");
    tx.fetch_i64(sql, &[]).await?;
    Ok(())
}

pub(crate) async fn setup(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE IF NOT EXISTS engine_effects (event_id TEXT NOT NULL, handler TEXT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

pub(crate) fn fast() -> OutboxConfig {
    OutboxConfig::default()
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        })
        .lease(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(20))
}

/// An outbox over `db` with the handlers of `dispatcher`, `calls` as a resource and the
/// [`fast`] configuration, `configure` applied last (a later `.config(…)` replaces it).
pub(crate) async fn outbox_with(
    db: &Case,
    calls: &Arc<Calls>,
    dispatcher: crate::DispatcherBuilder,
    configure: impl FnOnce(crate::OutboxBuilder) -> crate::OutboxBuilder,
) -> Outbox {
    let store = db.open().await;
    setup(&store).await;
    let builder = Outbox::builder(store)
        .dispatcher(dispatcher)
        .resource_arc(Arc::clone(calls))
        .config(fast());
    configure(builder).build().unwrap()
}

/// An outbox over `db` with the three handlers of this file.
pub(crate) async fn outbox(db: &Case, calls: &Arc<Calls>, config: OutboxConfig) -> Outbox {
    let handlers = Dispatcher::builder_empty()
        .handler::<in_tx>()
        .handler::<external>()
        .handler::<external2>();
    outbox_with(db, calls, handlers, |b| b.config(config)).await
}

/// Commits events `acts` for `stream`, sequenced from `first`.
pub(crate) async fn commit(outbox: &Outbox, stream: &str, first: u64, acts: Vec<Act>) -> Vec<Uuid> {
    let mut uow = outbox.begin().await.unwrap();
    let mut ids = Vec::new();
    for (i, act) in acts.into_iter().enumerate() {
        let n = first + i as u64;
        let e = Envelope::new(Ticked {
            stream: stream.into(),
            n,
            act,
        })
        .with_sequence(n);
        ids.push(e.id());
        uow.add(e);
    }
    uow.commit().await.unwrap();
    ids
}

pub(crate) async fn scalar(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(0);
    tx.rollback().await.unwrap();
    n
}

async fn effects(store: &Store, id: Uuid) -> i64 {
    scalar(
        store,
        "SELECT COUNT(*) FROM engine_effects WHERE event_id = $1",
        &[SqlValue::Text(&id.to_string())],
    )
    .await
}

async fn attempts(store: &Store, handler: &str, id: Uuid) -> i64 {
    scalar(
        store,
        "SELECT attempts FROM event_deliveries WHERE handler = $1 AND event_id = $2",
        &[SqlValue::Text(handler), SqlValue::Text(&id.to_string())],
    )
    .await
}

pub(crate) async fn status_is(store: &Store, handler: &str, id: Uuid, status: &str) -> bool {
    scalar(
        store,
        "SELECT COUNT(*) FROM event_deliveries WHERE handler = $1 AND event_id = $2 AND status = $3",
        &[
            SqlValue::Text(handler),
            SqlValue::Text(&id.to_string()),
            SqlValue::Text(status),
        ],
    )
    .await
        == 1
}

/// Polls `done` until it holds (a minute at most).
async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const DRAIN: Duration = Duration::from_secs(60);

pub async fn a_handler_slower_than_the_lease_is_not_taken_over_by_other_workers(db: &Case) {
    // Each delivery runs for 1.5 lease lengths; three workers compete. A lease that is not
    // renewed is taken over and the handler runs again (0.1.0: livelock on PostgreSQL).
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    let mut ids = Vec::new();
    for s in ["s1", "s2", "s3"] {
        ids.extend(commit(&outbox, s, 1, vec![Act::Sleep(1_500)]).await);
    }
    let workers = outbox.spawn_workers(3);
    wait_until("every delivery completed", async || {
        outbox.store().stats().await.unwrap().pending == 0
    })
    .await;
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
    for id in ids {
        // engine.tx and engine.ext each ran once per event.
        for h in ["tx", "ext"] {
            assert_eq!(calls.of_in(h, id), 1, "{}: {h} of event {id}", db.label());
        }
        assert_eq!(effects(outbox.store(), id).await, 1, "{}", db.label());
    }
}

pub async fn a_worker_that_lost_its_lease_records_nothing_and_undoes_only_what_was_taken_over(
    db: &Case,
) {
    let calls = Arc::new(Calls::default());
    // One worker delivers both aggregates in one claim.
    let config = fast().concurrency(4);
    // Where an open write transaction holds the database's one write lock (SQLite), a handler
    // inside the batch transaction holds it while it runs, so nothing else can write (take
    // its delivery over, or drop the lease row) until it ends: there the case is made with
    // the handlers outside a transaction.
    let with_tx = db.fixtures().concurrent_writes;
    let open = async |config: OutboxConfig| {
        let store = db.open().await;
        setup(&store).await;
        let d = Dispatcher::builder_empty()
            .handler::<external>()
            .handler::<external2>();
        let d = if with_tx { d.handler::<in_tx>() } else { d };
        Outbox::builder(store)
            .dispatcher(d)
            .resource_arc(Arc::clone(&calls))
            .config(config)
            .build()
            .unwrap()
    };
    let a = open(config.clone()).await;
    let b = open(config).await;
    // The gated event runs in both handlers; `y` is quick.
    let x = commit(&a, "x", 1, vec![Act::Gate]).await[0];
    let y = commit(&a, "y", 1, vec![Act::Ok]).await[0];
    let stalled = tokio::spawn({
        let a = a.clone();
        async move { a.deliver_batch().await }
    });
    calls.started().await;
    wait_until("the gated call started", async || calls.of(x) >= 1).await;
    // Worker a stalls (a paused process, a partition): its lease row disappears, as when it
    // lapsed and was cleaned up. Worker b takes the gated deliveries over.
    let mut tx = a.store().begin().await.unwrap();
    tx.execute("DELETE FROM event_leases", &[]).await.unwrap();
    tx.commit().await.unwrap();
    let taken = b.deliver_batch().await.unwrap();
    assert!(taken.claimed >= 1, "{}: {taken:?}", db.label());
    calls.open_gate();
    let stalled = stalled.await.unwrap().unwrap();
    assert!(stalled.lease_lost >= 1, "{}: {stalled:?}", db.label());
    a.drain(DRAIN).await.unwrap();
    // Every delivery completed once; the gated one ran twice (at-least-once), and its
    // database effect stands once: the stalled worker's was undone, the quick one kept.
    let handlers: &[&str] = if with_tx {
        &["engine.tx", "engine.ext"]
    } else {
        &["engine.ext"]
    };
    for &h in handlers {
        assert!(
            status_is(a.store(), h, x, "completed").await,
            "{}",
            db.label()
        );
        assert!(
            status_is(a.store(), h, y, "completed").await,
            "{}",
            db.label()
        );
    }
    if with_tx {
        assert_eq!(effects(a.store(), y).await, 1, "{}", db.label());
        assert_eq!(effects(a.store(), x).await, 1, "{}", db.label());
    }
}

pub async fn a_handler_without_a_transaction_does_not_hold_back_application_writes(db: &Case) {
    let calls = Arc::new(Calls::default());
    let store = db.open().await;
    setup(&store).await;
    // Only the handler without a transaction.
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<external>())
        .resource_arc(Arc::clone(&calls))
        .config(fast())
        .build()
        .unwrap();
    commit(&outbox, "slow", 1, vec![Act::Sleep(2_000)]).await;
    let workers = outbox.spawn_workers(1);
    calls.started().await;
    // While the 2 s call runs, the application commits (on SQLite: takes the write lock).
    let started = Instant::now();
    commit(&outbox, "other", 1, vec![Act::Ok]).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "{}: an application commit waited {took:?} behind a handler without a transaction",
        db.label()
    );
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
}

pub async fn handlers_without_a_transaction_run_concurrently_across_aggregates(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b.config(fast().concurrency(16)),
    )
    .await;
    for s in 0..16 {
        commit(
            &outbox,
            &format!("c{s}"),
            1,
            vec![Act::Sleep(100), Act::Sleep(100)],
        )
        .await;
    }
    outbox.drain(DRAIN).await.unwrap();
    assert!(
        calls.max_running() >= 8,
        "{}: at most {} calls at once",
        db.label(),
        calls.max_running()
    );
    assert!(
        !calls.overlap_within_aggregate.load(Ordering::SeqCst),
        "{}: two calls of one aggregate overlapped",
        db.label()
    );
    for s in 0..16 {
        assert_eq!(calls.order(&format!("c{s}")), [1, 2], "{}", db.label());
    }
}

pub async fn a_claim_takes_a_whole_run_of_one_aggregate(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<in_tx>(),
        |b| b.config(fast().batch_size(128)),
    )
    .await;
    commit(&outbox, "hot", 1, vec![Act::Ok; 100]).await;
    let r = outbox.deliver_batch().await.unwrap();
    // 0.1.0 claimed one delivery of an aggregate per batch: 2,000 events of one aggregate
    // took 36-80 s on PostgreSQL.
    assert_eq!((r.claimed, r.completed), (100, 100), "{}", db.label());
    assert_eq!(calls.order("hot"), (1..=100).collect::<Vec<u64>>());
}

pub async fn a_failing_head_uses_no_attempt_of_the_run_behind_it(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b,
    )
    .await;
    let ids = commit(
        &outbox,
        "h",
        1,
        vec![Act::Fail, Act::Ok, Act::Ok, Act::Ok, Act::Ok],
    )
    .await;
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!(
        (r.claimed, r.retried, r.completed),
        (5, 1, 0),
        "{}",
        db.label()
    );
    let s = outbox.store();
    assert_eq!(attempts(s, "engine.ext", ids[0]).await, 1, "{}", db.label());
    for id in &ids[1..] {
        assert_eq!(attempts(s, "engine.ext", *id).await, 0, "{}", db.label());
        assert_eq!(calls.of(*id), 0);
    }
}

pub async fn a_handler_over_its_time_limit_is_retried(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| {
            b.handler_options(
                "engine.ext",
                HandlerOptions::new().timeout(Duration::from_millis(200)),
            )
            .config(fast())
        },
    )
    .await;
    let id = commit(&outbox, "t", 1, vec![Act::SleepOnce(10_000)]).await[0];
    let started = Instant::now();
    outbox.drain(DRAIN).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "{}", db.label());
    assert_eq!(calls.of(id), 2);
    assert_eq!(attempts(outbox.store(), "engine.ext", id).await, 2);
    assert!(status_is(outbox.store(), "engine.ext", id, "completed").await);
}

pub async fn a_statement_over_the_time_limit_is_stopped_in_the_database(db: &Case) {
    let Some(long_statement) = db.long_statement() else {
        return;
    };
    let calls = Arc::new(Calls {
        long_statement: Some(long_statement),
        ..Calls::default()
    });
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<in_tx>(),
        |b| {
            b.handler_options(
                "engine.tx",
                HandlerOptions::new().timeout(Duration::from_millis(500)),
            )
            .config(fast())
        },
    )
    .await;
    let id = commit(&outbox, "st", 1, vec![Act::LongStatement]).await[0];
    let started = Instant::now();
    outbox.drain(DRAIN).await.unwrap();
    // The statement would run for minutes: the database stopped it at the limit, and the
    // retry found the connection usable.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{}: took {:?}",
        db.label(),
        started.elapsed()
    );
    assert_eq!(attempts(outbox.store(), "engine.tx", id).await, 2);
    assert_eq!(effects(outbox.store(), id).await, 1, "{}", db.label());
}

pub async fn an_error_message_with_nul_is_stored_and_the_rest_of_the_batch_completes(db: &Case) {
    // PostgreSQL refuses U+0000 in text: 0.1.0 abandoned the whole batch, for ever.
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    let bad = commit(&outbox, "nul", 1, vec![Act::Refuse("bad\0byte".into())]).await[0];
    let mut fine = Vec::new();
    for s in 0..4 {
        fine.extend(commit(&outbox, &format!("ok{s}"), 1, vec![Act::Ok]).await);
    }
    let r = outbox.deliver_batch().await.unwrap();
    // Three handlers: the refused event's two that refuse are dead letters, the rest of the
    // batch (its third handler, and every handler of the four others) completes.
    assert_eq!(
        (r.completed, r.dead_lettered),
        (13, 2),
        "{}: {r:?}",
        db.label()
    );
    for id in fine {
        assert_eq!(effects(outbox.store(), id).await, 1);
    }
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    for d in dead {
        assert_eq!(d.event_id, bad);
        assert_eq!(d.reason, "permanent");
        assert!(
            d.error_chain[0].starts_with("bad\u{FFFD}byte")
                && d.error_chain[0].contains("1 NUL character replaced"),
            "{:?}",
            d.error_chain
        );
    }
}

pub async fn an_outcome_the_database_refuses_is_dead_lettered_alone(db: &Case) {
    let Some(refuse) = db.refuse_dead_letter() else {
        return;
    };
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    if !db.needs(outbox.store(), &[Capability::Inspection]) {
        return;
    }
    // A trigger refuses the dead letter of one delivery: what any database refusal of
    // bookkeeping looks like to the engine.
    let mut tx = outbox.store().begin().await.unwrap();
    for &sql in refuse {
        tx.execute(sql, &[]).await.unwrap();
    }
    tx.commit().await.unwrap();
    let poison = commit(&outbox, "p", 1, vec![Act::Refuse("poison".into())]).await[0];
    let fine = commit(&outbox, "q", 1, vec![Act::Ok]).await[0];
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!(
        (r.completed, r.dead_lettered),
        (4, 2),
        "{}: {r:?}",
        db.label()
    );
    assert_eq!(effects(outbox.store(), fine).await, 1);
    let dead = outbox
        .store()
        .dead_letters(&DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 2, "{}", db.label());
    for d in dead {
        assert_eq!(d.event_id, poison);
        assert_eq!(d.reason, "unrecordable", "{}", db.label());
        assert!(
            d.error_chain[0].contains("could not be recorded")
                && d.error_chain[0].contains("refused by the test trigger"),
            "{:?}",
            d.error_chain
        );
    }
    // Nothing is left leased or pending.
    assert_eq!(outbox.store().stats().await.unwrap().pending, 0);
}

pub async fn a_conflict_names_the_rejected_event(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    commit(&outbox, "k", 1, vec![Act::Ok, Act::Ok, Act::Ok]).await;
    // A stale copy of the aggregate records 4, 5 and (again) 2.
    let mut uow = outbox.begin().await.unwrap();
    for n in [4, 5, 2] {
        uow.add(
            Envelope::new(Ticked {
                stream: "k".into(),
                n,
                act: Act::Ok,
            })
            .with_sequence(n),
        );
    }
    let err = uow.commit().await.unwrap_err();
    match err {
        OutboxError::Store(StoreError::Conflict {
            aggregate_type,
            aggregate_id,
            sequence,
        }) => {
            assert_eq!(
                (aggregate_type.as_str(), aggregate_id.as_str(), sequence),
                ("engine", "k", 2),
                "{}",
                db.label()
            );
        }
        other => panic!("{}: {other:?}", db.label()),
    }
}

pub async fn a_paused_destination_is_not_claimed_and_uses_no_attempts(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty()
            .handler::<external>()
            .handler::<external2>(),
        |b| b,
    )
    .await;
    let s = outbox.store();
    s.pause_destination("engine.ext", "the mail provider is down")
        .await
        .unwrap();
    let ids = commit(&outbox, "ps", 1, vec![Act::Ok, Act::Ok]).await;
    outbox.drain(DRAIN).await.unwrap();
    for id in &ids {
        assert!(
            status_is(s, "engine.ext2", *id, "completed").await,
            "{}",
            db.label()
        );
        assert!(
            status_is(s, "engine.ext", *id, "pending").await,
            "{}",
            db.label()
        );
        assert_eq!(attempts(s, "engine.ext", *id).await, 0);
    }
    let paused = s.paused_destinations().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].destination.as_str(), paused[0].paused_by.as_str()),
        ("engine.ext", "operator")
    );
    let stats = s.stats().await.unwrap();
    assert!(stats
        .handlers
        .iter()
        .any(|h| h.handler == "engine.ext" && h.paused));
    // The backlog the gauges read agrees: the paused destination's two deliveries wait.
    let backlog = s.backlog().await.unwrap();
    let pending: Vec<(&str, u64)> = backlog
        .destinations
        .iter()
        .map(|d| (d.destination.as_str(), d.pending))
        .collect();
    assert_eq!(pending, [("engine.ext", 2)], "{}", db.label());
    assert_eq!(backlog.pending(), stats.pending, "{}", db.label());
    let age = backlog.oldest_pending_age_secs().unwrap();
    assert!((0.0..60.0).contains(&age), "{}: {age}", db.label());
    assert_eq!(backlog.paused, ["engine.ext"], "{}", db.label());
    assert_eq!(backlog.dead_letters, stats.dead_letters, "{}", db.label());
    // A second process sees the pause too.
    let other = db.open().await;
    assert_eq!(other.paused_destinations().await.unwrap().len(), 1);

    assert!(s.resume_destination("engine.ext").await.unwrap());
    outbox.drain(DRAIN).await.unwrap();
    let backlog = s.backlog().await.unwrap();
    assert!(
        backlog.destinations.is_empty(),
        "{}: {backlog:?}",
        db.label()
    );
    assert!(backlog.paused.is_empty(), "{}: {backlog:?}", db.label());
    for id in &ids {
        assert!(
            status_is(s, "engine.ext", *id, "completed").await,
            "{}",
            db.label()
        );
        assert_eq!(attempts(s, "engine.ext", *id).await, 1);
    }
}

/// A transport's destination whose broker can be switched off.
struct Flaky {
    up: AtomicBool,
    delivered: Mutex<Vec<Uuid>>,
}

#[async_trait]
impl Destination for Flaky {
    fn name(&self) -> &str {
        "engine.relay"
    }

    fn route(&self, event: &EventDescriptor) -> Option<Routing> {
        (event.name == "engine.ticked").then_some(Routing { ordered: true })
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Result<(), DeliveryError> {
        if !self.up.load(Ordering::SeqCst) {
            return Err(DeliveryError::Unavailable {
                reason: "connection refused".into(),
                retry_after: Duration::from_millis(100),
            });
        }
        self.delivered.lock().unwrap().push(d.event_id);
        Ok(())
    }

    async fn available(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }
}

pub async fn an_unavailable_destination_pauses_itself_until_it_is_back(db: &Case) {
    let calls = Arc::new(Calls::default());
    let store = db.open().await;
    setup(&store).await;
    let relay = Arc::new(Flaky {
        up: AtomicBool::new(false),
        delivered: Mutex::new(Vec::new()),
    });
    let outbox = Outbox::builder(store)
        .dispatcher(Dispatcher::builder_empty().handler::<external2>())
        .destination(Arc::clone(&relay) as Arc<dyn Destination>)
        .resource_arc(Arc::clone(&calls))
        .config(fast())
        .build()
        .unwrap();
    let ids = commit(&outbox, "u", 1, vec![Act::Ok, Act::Ok, Act::Ok]).await;
    outbox.drain(DRAIN).await.unwrap();
    let s = outbox.store();
    let paused = s.paused_destinations().await.unwrap();
    assert_eq!(paused.len(), 1, "{}", db.label());
    assert_eq!(paused[0].destination, "engine.relay");
    assert_eq!(paused[0].reason, "connection refused");
    for id in &ids {
        assert!(status_is(s, "engine.ext2", *id, "completed").await);
        assert!(status_is(s, "engine.relay", *id, "pending").await);
        assert_eq!(attempts(s, "engine.relay", *id).await, 0, "no attempt used");
    }
    // An outage of any length dead-letters nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.stats().await.unwrap().dead_letters, 0);
    relay.up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    outbox.drain(DRAIN).await.unwrap();
    assert_eq!(
        *relay.delivered.lock().unwrap(),
        ids,
        "{}: in order",
        db.label()
    );
    assert!(s.paused_destinations().await.unwrap().is_empty());
}

pub async fn workers_stop_with_the_applications_cancellation_token(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox(db, &calls, fast()).await;
    let token = CancellationToken::new();
    let workers = outbox.spawn_workers_with(2, token.clone());
    let ids = commit(&outbox, "w", 1, vec![Act::Ok, Act::Ok]).await;
    wait_until("delivered", async || {
        outbox.store().stats().await.unwrap().pending == 0
    })
    .await;
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), workers.wait())
        .await
        .expect("the workers stopped");
    // They gave their leases back.
    assert_eq!(
        scalar(outbox.store(), "SELECT COUNT(*) FROM event_leases", &[]).await,
        0,
        "{}",
        db.label()
    );
    for id in ids {
        assert_eq!(effects(outbox.store(), id).await, 1);
    }
}

pub async fn an_aborted_shutdown_gives_its_deliveries_back_at_once(db: &Case) {
    let calls = Arc::new(Calls::default());
    let outbox = outbox_with(
        db,
        &calls,
        Dispatcher::builder_empty().handler::<external>(),
        |b| b.config(fast().lease(Duration::from_secs(30))),
    )
    .await;
    let id = commit(&outbox, "a", 1, vec![Act::SleepOnce(5_000)]).await[0];
    let workers = outbox.spawn_workers(1);
    calls.started().await;
    let released = workers.shutdown(Duration::from_millis(100)).await.unwrap();
    assert_eq!(released, 1, "{}", db.label());
    // Due again at once, not after the 30 s lease; the attempt did not count.
    let r = outbox.deliver_batch().await.unwrap();
    assert_eq!((r.claimed, r.completed), (1, 1), "{}", db.label());
    assert_eq!(attempts(outbox.store(), "engine.ext", id).await, 1);
}
