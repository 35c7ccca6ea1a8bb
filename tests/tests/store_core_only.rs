//! A store backend from outside `event-runtime`, worked through: `CoreOnly` implements only the
//! core of the store boundary (`Backend` and its supertrait `ChainStore`, by delegating to an
//! SQLite store) and offers none of the optional capabilities (`Inspection`,
//! `DeadLetterOperations`, `DestinationOperations`, `OperationLog`, `PartitionLeases`). What
//! such a backend gets:
//!
//! - the whole conformance suite with one `conformance_suite!` line: every case passes, or is
//!   skipped with a note naming the capability it needs (none fails);
//! - the operations built on a capability fail with `StoreError::Unsupported`, naming the
//!   backend and the capability (which the `events` tool prints as it is);
//! - an outbox over it commits and delivers as over any other store.

mod common;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
use event_runtime::inbox::Origin;
use event_runtime::store::backend::{
    ChainStore, ClaimRequest, ClaimedDelivery, DeadLetterOperations, DestinationOperations, Gap,
    Inspection, Pause, ProbeClaim, ProbeRequest, PurgeStep, RelayChainKey, RelayChainState,
    SettleResult, Settlement,
};
use event_runtime::store::{AuditStamp, Backend, Datum};
use event_runtime::testing::conformance::{SqlFixtures, TestDatabase};
use event_runtime::{
    AuditEntry, Backlog, CatalogRecord, DeadLetterFilter, Dispatcher, InboxIdentity, Outbox,
    OutboxStats, PausedDestination, Resolution, Row, SqlValue, Store, StoreError, Tx,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The core of a store: every method of `Backend` and `ChainStore` is the inner store's.
/// With `resolving`, it also offers the inner store's `Inspection`, `DeadLetterOperations` and
/// `DestinationOperations` — but never `OperationLog`, which paged operations need to finish;
/// without, every capability accessor keeps its default, `None`.
#[derive(Debug)]
struct CoreOnly {
    inner: Store,
    resolving: bool,
}

impl CoreOnly {
    /// The SQLite backend inside.
    fn inner(&self) -> &dyn Backend {
        self.inner.backend()
    }
}

#[async_trait]
impl Backend for CoreOnly {
    fn name(&self) -> &'static str {
        "core-only"
    }

    /// Its transactions are the inner store's: a handler may take `sqlx::SqliteConnection`.
    fn native_transaction_types(&self) -> Vec<TypeId> {
        self.inner().native_transaction_types()
    }

    /// This value, not the inner one: `event_runtime::store::sqlite::pool` would otherwise hand
    /// out the SQLite pool of a store that says it is another backend.
    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.inner().migrate().await
    }

    async fn has_outbox(&self) -> Result<bool, StoreError> {
        self.inner().has_outbox().await
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        self.inner().begin().await
    }

    async fn execute(&self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        self.inner().execute(sql, args).await
    }

    async fn fetch(&self, sql: &str, args: &[Datum], first: bool) -> Result<Vec<Row>, StoreError> {
        self.inner().fetch(sql, args, first).await
    }

    async fn close(&self) {
        self.inner().close().await
    }

    fn is_conflict(&self, error: &(dyn std::error::Error + 'static)) -> bool {
        self.inner().is_conflict(error)
    }

    async fn renew_lease(&self, token: &str, expires_at: i64) -> Result<bool, StoreError> {
        self.inner().renew_lease(token, expires_at).await
    }

    async fn drop_lease(&self, token: &str) -> Result<u64, StoreError> {
        self.inner().drop_lease(token).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedDelivery>, StoreError> {
        self.inner().claim(req).await
    }

    async fn settle(
        &self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError> {
        self.inner().settle(token, now, batch).await
    }

    async fn repair_runs(&self, expired_before: i64) -> Result<u64, StoreError> {
        self.inner().repair_runs(expired_before).await
    }

    async fn progressing(&self, destinations: &[String]) -> Result<u64, StoreError> {
        self.inner().progressing(destinations).await
    }

    async fn claim_probe(&self, req: &ProbeRequest<'_>) -> Result<ProbeClaim, StoreError> {
        self.inner().claim_probe(req).await
    }

    async fn pause(&self, pause: &Pause) -> Result<(), StoreError> {
        self.inner().pause(pause).await
    }

    async fn resume(&self, destination: &str, paused_by: &str) -> Result<bool, StoreError> {
        self.inner().resume(destination, paused_by).await
    }

    async fn paused(&self, now: i64) -> Result<Vec<PausedDestination>, StoreError> {
        self.inner().paused(now).await
    }

    async fn purge_completed(&self, cutoff: i64, batch: u32) -> Result<PurgeStep, StoreError> {
        self.inner().purge_completed(cutoff, batch).await
    }

    async fn refresh_statistics(&self) -> Result<(), StoreError> {
        self.inner().refresh_statistics().await
    }

    async fn stats(&self, now: i64) -> Result<OutboxStats, StoreError> {
        self.inner().stats(now).await
    }

    async fn backlog(&self, now: i64) -> Result<Backlog, StoreError> {
        self.inner().backlog(now).await
    }

    async fn record_catalog(&self, entries: &[CatalogRecord], now: i64) -> Result<(), StoreError> {
        self.inner().record_catalog(entries, now).await
    }

    fn inspection(&self) -> Option<&dyn Inspection> {
        self.inner().inspection().filter(|_| self.resolving)
    }

    fn dead_letter_operations(&self) -> Option<&dyn DeadLetterOperations> {
        self.inner()
            .dead_letter_operations()
            .filter(|_| self.resolving)
    }

    fn destination_operations(&self) -> Option<&dyn DestinationOperations> {
        self.inner()
            .destination_operations()
            .filter(|_| self.resolving)
    }

    async fn catalog(&self) -> Result<Vec<CatalogRecord>, StoreError> {
        self.inner().catalog().await
    }
}

#[async_trait]
impl ChainStore for CoreOnly {
    async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError> {
        self.inner().inbox_identity(inbox).await
    }

    async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
        now: i64,
    ) -> Result<InboxIdentity, StoreError> {
        self.inner().record_inbox_identity(identity, now).await
    }

    async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError> {
        self.inner().adopt_inbox_identity(identity, stamp).await
    }

    async fn received_origin(&self, event_id: Uuid) -> Result<Option<Origin>, StoreError> {
        self.inner().received_origin(event_id).await
    }

    async fn relay_chain(
        &self,
        keys: &[RelayChainKey],
        fresh_after: i64,
    ) -> Result<HashMap<RelayChainKey, RelayChainState>, StoreError> {
        self.inner().relay_chain(keys, fresh_after).await
    }

    async fn published_sequences(
        &self,
        destination: &str,
        aggregate: (&str, &str),
        below: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StoreError> {
        self.inner()
            .published_sequences(destination, aggregate, below, limit)
            .await
    }

    async fn open_gaps(&self, older: i64, now: i64, limit: usize) -> Result<Vec<Gap>, StoreError> {
        self.inner().open_gaps(older, now, limit).await
    }

    async fn gaps(&self, all: bool, after: i64, limit: usize) -> Result<Vec<Gap>, StoreError> {
        self.inner().gaps(all, after, limit).await
    }

    async fn accept_gaps(&self, ids: &[i64], audit: i64, now: i64) -> Result<Vec<Gap>, StoreError> {
        self.inner().accept_gaps(ids, audit, now).await
    }

    async fn held_events(&self) -> Result<u64, StoreError> {
        self.inner().held_events().await
    }

    async fn purge_chains(&self, cutoff: i64, limit: usize) -> Result<u64, StoreError> {
        self.inner().purge_chains(cutoff, limit).await
    }
}

/// A `CoreOnly` store over the SQLite file of `url`, migrated.
async fn open(url: &str) -> Result<Store, StoreError> {
    open_with(url, false).await
}

/// A `CoreOnly` store over the SQLite file of `url`, migrated, with `resolving` as given.
async fn open_with(url: &str, resolving: bool) -> Result<Store, StoreError> {
    let inner = Store::connect(url).await?;
    Ok(Store::from_backend(Arc::new(CoreOnly { inner, resolving })))
}

/// A fresh SQLite file behind a `CoreOnly` backend, for each case of the suite.
async fn core_only(case: &str) -> Option<TestDatabase> {
    let url = common::sqlite_url(case);
    Some(TestDatabase::new(
        "core-only",
        SqlFixtures::SQLITE,
        move || {
            let url = url.clone();
            async move { open(&url).await }
        },
    ))
}

event_runtime::conformance_suite!(core_only, core_only);

/// `result` is `StoreError::Unsupported` naming `capability` and the `core-only` backend, and
/// says so.
fn assert_unsupported<T: std::fmt::Debug>(result: Result<T, StoreError>, capability: &str) {
    let err = result.unwrap_err();
    match &err {
        StoreError::Unsupported {
            backend: "core-only",
            capability: c,
        } if *c == capability => {}
        other => panic!("expected Unsupported {capability}, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!("the core-only store does not offer {capability}, which this operation needs")
    );
}

#[tokio::test]
async fn operations_built_on_a_capability_are_unsupported_and_name_it() {
    let store = open(&common::sqlite_url("core_only_unsupported"))
        .await
        .unwrap();
    assert_eq!(store.backend_name(), "core-only");
    assert!(store.inspection().is_none());
    assert!(store.dead_letter_operations().is_none());
    assert!(store.destination_operations().is_none());
    assert!(store.operation_log().is_none());
    assert!(store.partition_leases().is_none());
    // `as_any` is the wrapper's own: the SQLite pool inside is not reachable.
    assert!(event_runtime::store::sqlite::pool(&store).is_none());

    let all = DeadLetterFilter::default();
    assert_unsupported(store.dead_letters(&all).await, "Inspection");
    assert_unsupported(store.dead_letter_by_id(1).await, "Inspection");
    assert_unsupported(store.count_dead_letters(&all).await, "Inspection");
    assert_unsupported(store.audit_log(10).await, "Inspection");
    assert_unsupported(store.pending_envelopes().await, "Inspection");
    assert_unsupported(
        store
            .resolve_dead_letters(&[1], Resolution::Replay, "ops", "fixed")
            .await,
        "DeadLetterOperations",
    );
    assert_unsupported(
        store
            .resolve_matching(&all, Resolution::Purge, "ops", "gone", |_| {})
            .await,
        "DeadLetterOperations",
    );
    assert_unsupported(
        store
            .pause_destination_audited("mailer", "ops", "down")
            .await,
        "DestinationOperations",
    );
    assert_unsupported(
        store.purge_destination("old", "ops", "removed").await,
        "DestinationOperations",
    );
    assert_unsupported(store.group_view("billing").await, "PartitionLeases");

    // The core still answers: statistics, an operator's (unaudited) pause, the catalog.
    assert_eq!(store.stats().await.unwrap().pending, 0);
    store.pause_destination("mailer", "down").await.unwrap();
    assert_eq!(store.paused_destinations().await.unwrap().len(), 1);
    assert!(store.resume_destination("mailer").await.unwrap());
    assert!(store.catalog().await.unwrap().is_empty());
    store.close().await;
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "note.written", version = 1)]
struct Written {
    #[event(aggregate_id)]
    note: String,
    /// The handler refuses it for good.
    refused: bool,
}

/// Records the note in the delivery's transaction, or refuses it.
#[event_handler(name = "notes")]
async fn notes(envelope: &Envelope<Written>, tx: &mut Tx) -> Result<(), HandlerError> {
    let e = envelope.event();
    if e.refused {
        return Err(HandlerError::permanent_msg("refused"));
    }
    tx.execute(
        "INSERT INTO notes (note, seq) VALUES ($1, $2)",
        &[
            SqlValue::Text(&e.note),
            SqlValue::Int(envelope.sequence() as i64),
        ],
    )
    .await?;
    Ok(())
}

/// The `notes` table and an outbox over `store` with the `notes` handler.
async fn notes_outbox(store: &Store) -> Outbox {
    store
        .query("CREATE TABLE notes (note TEXT NOT NULL, seq BIGINT NOT NULL)")
        .execute()
        .await
        .unwrap();
    Outbox::builder(store.clone())
        .dispatcher(Dispatcher::builder_empty().handler::<notes>())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_outbox_over_the_core_alone_delivers() {
    let store = open(&common::sqlite_url("core_only_outbox")).await.unwrap();
    let outbox = notes_outbox(&store).await;
    let mut uow = outbox.begin().await.unwrap();
    // Note `a`'s three events are delivered in order; note `b`'s is refused.
    for (note, seq, refused) in [
        ("a", 1, false),
        ("a", 2, false),
        ("a", 3, false),
        ("b", 1, true),
    ] {
        let e = Written {
            note: note.into(),
            refused,
        };
        uow.add(Envelope::new(e).with_sequence(seq));
    }
    assert_eq!(uow.commit().await.unwrap().appended, 4);

    // The background workers (lease renewal, gauges, catalog, retention) need only the core.
    let workers = outbox.spawn_workers(1);
    common::eventually(
        Duration::from_secs(30),
        "every delivery settled",
        || async { store.stats().await.unwrap().pending == 0 },
    )
    .await;
    assert_eq!(workers.shutdown(Duration::from_secs(5)).await.unwrap(), 0);

    let seqs: Vec<i64> = store
        .query("SELECT seq FROM notes WHERE note = 'a' ORDER BY seq")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("seq").unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    // The refused event is a dead letter: counted by the core's statistics, listed only by a
    // backend that offers Inspection.
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dead_letters, stats.handlers[0].completed), (1, 3));
    assert_unsupported(
        store.dead_letters(&DeadLetterFilter::default()).await,
        "Inspection",
    );
    store.close().await;
}

/// A backend that offers replay and purge but not the audit rows a paged operation finishes
/// with: the paged operations are refused before their first write, so that no dead letter is
/// resolved under an audit row nothing can finish.
#[tokio::test]
async fn a_capability_missing_midway_is_refused_before_the_first_write() {
    let store = open_with(&common::sqlite_url("core_only_partial"), true)
        .await
        .unwrap();
    let outbox = notes_outbox(&store).await;
    let mut uow = outbox.begin().await.unwrap();
    let refused = Written {
        note: "c".into(),
        refused: true,
    };
    uow.add(Envelope::new(refused).with_sequence(1));
    uow.commit().await.unwrap();
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    let open_letters = DeadLetterFilter::default();
    assert_eq!(store.dead_letters(&open_letters).await.unwrap().len(), 1);

    assert_unsupported(
        store
            .resolve_matching(&open_letters, Resolution::Purge, "ops", "gone", |_| {})
            .await,
        "OperationLog",
    );
    assert_unsupported(
        store.purge_destination("notes", "ops", "removed").await,
        "OperationLog",
    );
    // Nothing was resolved, and no audit row was started.
    assert_eq!(store.dead_letters(&open_letters).await.unwrap().len(), 1);
    assert!(store.audit_log(10).await.unwrap().is_empty());
    // What needs no OperationLog still works: a replay by id, audited in one transaction.
    let id = store.dead_letters(&open_letters).await.unwrap()[0].id;
    store
        .resolve_dead_letters(&[id], Resolution::Purge, "ops", "gone")
        .await
        .unwrap();
    assert!(store.dead_letters(&open_letters).await.unwrap().is_empty());
    assert_eq!(store.audit_log(10).await.unwrap().len(), 1);
    store.close().await;
}

/// Opens a `CoreOnly` store for the `events` tool: what an application with a backend of its
/// own hands `App::store_opener`.
fn open_for_the_tool(
    url: &str,
    _options: &event_runtime::ConnectOptions,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Store, StoreError>> + Send>> {
    let url = url.to_owned();
    Box::pin(async move { open(&url).await })
}

/// The `events` tool over a backend of the application's own: what needs only the core works,
/// and a command that needs a capability the backend lacks fails naming it.
#[tokio::test]
async fn the_events_tool_opens_an_own_backend_and_names_what_it_lacks() {
    let url = common::sqlite_url("core_only_tool");
    open(&url).await.unwrap().close().await;
    let tool = |args: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let app = event_runtime::cli::App::standalone().store_opener(&open_for_the_tool);
            let mut argv = vec!["events".to_owned(), "--database".to_owned(), url];
            argv.extend(args.iter().map(|a| a.to_string()));
            let code = event_runtime::cli::run_with_output(argv, app, &mut out, &mut err).await;
            let text = String::from_utf8(out).unwrap() + &String::from_utf8(err).unwrap();
            (code == std::process::ExitCode::SUCCESS, text)
        }
    };
    let (ok, text) = tool(&["outbox", "stats"]).await;
    assert!(ok, "{text}");
    let (ok, text) = tool(&["dlq", "list"]).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("the core-only store does not offer Inspection, which this operation needs"),
        "{text}"
    );
}
