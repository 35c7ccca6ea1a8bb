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

mod pauses;
mod refusals;
mod runs;

pub use pauses::*;
pub use refusals::*;
pub use runs::*;
