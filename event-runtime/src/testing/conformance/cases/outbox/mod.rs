//! Conformance cases of the transactional outbox and durable delivery: commit, delivery once
//! with effects, retries, dead letters, replay and purge, per-aggregate order, leases and
//! workers. Every backend runs them (see `conformance_suite!`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use event_core::{event_handler, DomainEvent, Envelope, EventRecorder, HandlerError, RawEnvelope};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Capability, Case};
use crate::{
    DeadLetterFilter, Dispatcher, Outbox, OutboxConfig, OutboxError, Resolution, RetryPolicy,
    SqlValue, Store, StoreError, Tx,
};

/// How the `apply` handler behaves for one event.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) enum Fail {
    Never,
    /// Fails transiently on the first `n` attempts.
    Transient(u32),
    /// Panics on the first `n` attempts.
    Panic(u32),
    Permanent,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "account.deposited", version = 1, crate = crate::testing::conformance::unregistered)]
pub(crate) struct Deposited {
    #[event(aggregate_id)]
    pub(crate) account: String,
    pub(crate) amount: i64,
    pub(crate) fail: Fail,
}

/// Attempts per event id, across retries.
#[derive(Default)]
pub(crate) struct Attempts(Mutex<HashMap<Uuid, u32>>);

impl Attempts {
    fn bump(&self, id: Uuid) -> u32 {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(id).or_default();
        *n += 1;
        *n
    }
}

/// After commit: records its effect in the same transaction as the delivery's completion,
/// then fails as the event says (so the effect must be rolled back then).
#[event_handler(name = "apply", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn apply(
    envelope: &Envelope<Deposited>,
    tx: &mut Tx,
    attempts: &Attempts,
) -> Result<(), HandlerError> {
    let e = envelope.event();
    tx.execute(
        "INSERT INTO effects (event_id, handler, aggregate, seq) VALUES ($1, 'apply', $2, $3)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Text(&e.account),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    let n = attempts.bump(envelope.id());
    match e.fail {
        Fail::Transient(k) if n <= k => Err(HandlerError::transient_msg(format!(
            "attempt {n}: downstream busy"
        ))),
        Fail::Panic(k) if n <= k => panic!("attempt {n}: handler bug"),
        Fail::Permanent => Err(HandlerError::permanent_msg("account is closed")),
        _ => Ok(()),
    }
}

/// In transaction: refuses negative deposits, which aborts the whole commit.
#[event_handler(in_transaction, name = "check_amount", crate = crate::testing::conformance::unregistered)]
pub(crate) async fn check_amount(e: &Deposited, tx: &mut Tx) -> Result<(), HandlerError> {
    if e.amount < 0 {
        return Err(HandlerError::permanent_msg("negative deposit"));
    }
    tx.execute(
        "INSERT INTO ledger (account, amount) VALUES ($1, $2)",
        &[SqlValue::Text(&e.account), SqlValue::Int(e.amount)],
    )
    .await?;
    Ok(())
}

/// Unordered: an export whose effects commute, so a dead letter must not hold back later
/// events of the same aggregate.
#[event_handler(name = "export", unordered, crate = crate::testing::conformance::unregistered)]
pub(crate) async fn export(
    envelope: &Envelope<Deposited>,
    tx: &mut Tx,
) -> Result<(), HandlerError> {
    if envelope.event().fail == Fail::Permanent {
        return Err(HandlerError::permanent_msg("the legacy system refuses it"));
    }
    tx.execute(
        "INSERT INTO effects (event_id, handler, aggregate, seq) VALUES ($1, 'export', $2, $3)",
        &[
            SqlValue::Text(&envelope.id().to_string()),
            SqlValue::Text(&envelope.event().account),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    Ok(())
}

/// Creates the tables of this file's handlers and commits: `effects` (the backend's
/// [`effects_table`](crate::testing::conformance::SqlFixtures::effects_table)), `ledger`,
/// `accounts`.
pub(crate) async fn setup(store: &Store, db: &Case) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(db.checked_effects_table(), &[]).await.unwrap();
    tx.execute(
        "CREATE TABLE IF NOT EXISTS ledger (account TEXT NOT NULL, amount BIGINT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.execute(
        "CREATE TABLE IF NOT EXISTS accounts (account TEXT PRIMARY KEY)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

pub(crate) fn fast_retries() -> OutboxConfig {
    OutboxConfig::default()
        .retry(RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        })
        .batch_size(16)
}

/// An outbox over `db` with `apply` and `check_amount`, attempts counted, fast retries.
pub(crate) async fn outbox(db: &Case) -> Outbox {
    outbox_of(
        db,
        Dispatcher::builder_empty()
            .handler::<apply>()
            .handler::<check_amount>(),
    )
    .await
}

/// An outbox over `db` with the handlers of `dispatcher`, attempts counted, fast retries.
pub(crate) async fn outbox_of(db: &Case, dispatcher: crate::DispatcherBuilder) -> Outbox {
    let store = db.open().await;
    setup(&store, db).await;
    Outbox::builder(store)
        .dispatcher(dispatcher)
        .resource(Attempts::default())
        .config(fast_retries())
        .build()
        .unwrap()
}

pub(crate) fn deposit(account: &str, amount: i64, fail: Fail) -> Deposited {
    Deposited {
        account: account.into(),
        amount,
        fail,
    }
}

/// Commits `events` for one new aggregate, with the application's own write.
pub(crate) async fn commit(
    outbox: &Outbox,
    events: Vec<Deposited>,
) -> Result<Vec<Uuid>, OutboxError> {
    let mut uow = outbox.begin().await?;
    let account = events[0].account.clone();
    uow.tx()
        .execute(
            "INSERT INTO accounts (account) VALUES ($1) ON CONFLICT DO NOTHING",
            &[SqlValue::Text(&account)],
        )
        .await?;
    let mut recorder = EventRecorder::new();
    for e in events {
        recorder.record(e);
    }
    let ids = recorder.pending().iter().map(|e| e.metadata().id).collect();
    uow.extend(recorder.take());
    uow.commit().await?;
    Ok(ids)
}

pub(crate) async fn count(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(0);
    tx.commit().await.unwrap();
    n
}

pub(crate) async fn effects_of(store: &Store, id: Uuid) -> i64 {
    count(
        store,
        "SELECT COUNT(*) FROM effects WHERE event_id = $1",
        &[SqlValue::Text(&id.to_string())],
    )
    .await
}

pub(crate) const DRAIN: Duration = Duration::from_secs(30);

mod commit;
mod dead_letters;
mod workers;

pub use commit::*;
pub use dead_letters::*;
pub use workers::*;
