//! The conformance suite of the store boundary and the delivery engine: every behaviour the
//! outbox promises, as 42 cases that a backend — one of this crate's, or one of your own
//! ([`store::backend`](crate::store::backend)) — runs with one line in a test file:
//!
//! ```
//! use event_runtime::testing::conformance::{SqlFixtures, TestDatabase};
//! use event_runtime::ConnectOptions;
//!
//! /// A fresh SQLite file for each case.
//! async fn sqlite(case: &str) -> Option<TestDatabase> {
//!     let file = format!("conformance-{}-{case}.db", std::process::id());
//!     let path = std::env::temp_dir().join(file);
//!     let _ = std::fs::remove_file(&path); // left by an earlier run: not fresh
//!     let url = format!("sqlite://{}", path.display());
//!     let options = ConnectOptions::default();
//!     Some(TestDatabase::connect("sqlite", url, options, SqlFixtures::SQLITE))
//! }
//!
//! event_runtime::conformance_suite!(sqlite, sqlite);
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! #     let db = sqlite("doc_example").await.unwrap();
//! #     let store = db.open().await;
//! #     assert!(store.catalog().await.unwrap().is_empty());
//! #     store.close().await;
//! #     let file = format!("conformance-{}-doc_example.db", std::process::id());
//! #     let _ = std::fs::remove_file(std::env::temp_dir().join(file));
//! # }
//! ```
//!
//! [`conformance_suite!`](crate::conformance_suite)`(name, set_up)` declares a module `name`
//! holding one `#[tokio::test]` per case (multi-threaded runtime, two workers), so that each
//! case passes or fails on its own and `cargo test name::` runs one backend. The caller needs
//! neither tokio's macros nor the suite's event types: the attribute is tokio's, re-exported
//! here, and the suite's events and handlers live in this crate, unregistered — they never
//! join an application's [`Dispatcher::builder`](crate::Dispatcher::builder) or schema
//! catalog.
//!
//! # The set-up
//! `set_up` is an `async fn(&str) -> Option<TestDatabase>` in scope where the macro is
//! invoked (or an absolute path, `crate::…`), called once per case with the case's name:
//!
//! - it returns a [`TestDatabase`]: a **fresh** database of the backend (no rows of another
//!   case: a new file, a new schema, a new database), which the cases open as often as they
//!   need — a restarted process, a second worker pool — through [`TestDatabase::open`];
//!   every open gives a new [`Store`] on the same database, and the first one migrates it;
//! - with the [`SqlFixtures`] of the backend: the few statements the cases run beside the
//!   store's API whose SQL differs between databases, and how the database locks writers.
//!   [`SqlFixtures::SQLITE`] and [`SqlFixtures::POSTGRES`] are ready-made; a backend over
//!   another database writes its own, or supplies only some;
//! - or `None` when the backend cannot run here (its server is not configured): the case is
//!   then skipped — say why, once, on standard error; the test harness reports it as passed.
//!
//! # What each family of cases proves
//! - **outbox** (14 cases): a commit appends the events and their deliveries atomically with
//!   the application's writes, and an in-transaction handler's failure rolls all of it back;
//!   an event id appended twice has one effect; a second commit of an (aggregate, sequence)
//!   is a conflict; each delivery runs once with its database effects, and transient failures
//!   and panics are retried with their effects rolled back; permanent and exhausted failures,
//!   unknown event versions and undecodable payloads become dead letters that keep the
//!   envelope byte for byte; replay and purge are audited, and later events of an aggregate
//!   wait behind a dead letter (not an unordered handler's); workers deliver in the
//!   background and shut down gracefully; an expired lease is claimed again, a live one not; a
//!   process without a handler leaves its deliveries to one that has it.
//! - **crash** (4): the runtime stopped — as a killed process, or by killing its database
//!   connection — before COMMIT, after COMMIT, during a handler and after the handlers
//!   before completion; after a restart on the same database every accepted event's effects
//!   are applied exactly once and nothing accepted is lost. They inject faults, so they run
//!   only with this crate's feature `fault-injection` (skipped, and said so, without it).
//! - **engine** (15): handlers slower than the lease are not taken over; a worker that lost
//!   its lease records nothing and undoes only what was taken over; handlers without a
//!   transaction do not hold back application writes and run concurrently across
//!   aggregates; a claim takes a whole run of one aggregate, and a failing head uses no
//!   attempt of the run behind it; a handler or a statement over its time limit is stopped
//!   and retried; an error text the database refuses, or an outcome it refuses to record,
//!   dead-letters that delivery alone; a conflict names the rejected event; paused and
//!   unavailable destinations use no attempts; workers stop with a cancellation token, and
//!   an aborted shutdown gives its deliveries back at once.
//! - **catalog** (1): the schema catalog is recorded by (name, version), replaced, and read
//!   back in order with its sensitive fields and schema.
//! - **failure times** (1): a retry is never due before the failure recorded for it, however
//!   late the outcome is written.
//! - **retention** (1): old completed deliveries and the events nothing refers to are purged
//!   in bounded statements, by one purger at a time, while deliveries flow; nothing pending,
//!   leased or dead-lettered is touched; a purged event id is new again.
//! - **retarget** (5): what an unregistered handler left (pending deliveries, dead letters) is
//!   purged, or re-targeted onto another handler — merged into its runs in sequence order,
//!   duplicates dropped, resumable page by page, audited — and refused for a live or unknown
//!   handler.
//! - **unreadable** (1): a pending delivery whose row the engine cannot read is counted as
//!   unreadable by the statistics instead of staying pending silently.
//!
//! # Skipping
//! A case is skipped, never failed, when the backend cannot run it here: when `set_up`
//! returns `None` (say why yourself), when the [`SqlFixtures`] lack a statement the case
//! needs, when the backend does not offer an optional capability the case uses (its
//! accessor, [`Backend::inspection`](crate::store::backend::Backend::inspection) and its
//! siblings, returns `None`), and for the crash cases without the feature `fault-injection`.
//! All but the first print a note naming the case, the backend and what is missing on
//! standard error (which `cargo test` shows even for a passing test); the harness reports the
//! case as passed.
//!
//! A backend that implements only the core ([`Backend`](crate::store::backend::Backend) and
//! [`ChainStore`](crate::store::backend::ChainStore)) skips these 12 cases, each of which
//! declares the capabilities it uses as soon as it has opened its store:
//!
//! | capabilities | cases |
//! |---|---|
//! | `Inspection` | 4: permanent and exhausted failures, unknown and undecodable events (outbox); an error message with NUL, an outcome the database refuses (engine) |
//! | `Inspection`, `DeadLetterOperations` | 3: replay, a later event waits for a dead letter, purging a dead letter (outbox) |
//! | `Inspection`, `DestinationOperations` | 1: purging or re-targeting refused (retarget) |
//! | `Inspection`, `DestinationOperations`, `OperationLog` | 3: purging an unregistered handler, re-targeting in pages, onto an unordered handler (retarget) |
//! | `Inspection`, `DeadLetterOperations`, `DestinationOperations`, `OperationLog` | 1: re-targeting onto a union handler (retarget) |
//!
//! No case uses `PartitionLeases`.

#[doc(hidden)]
pub mod cases;
mod fixtures;
mod suite;
mod unregistered;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use fixtures::SqlFixtures;

use crate::store::{ConnectOptions, Store};

/// The error an opener reports.
type OpenError = Box<dyn std::error::Error + Send + Sync>;
/// Opens a new [`Store`] on the test database.
type Opener =
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Store, OpenError>> + Send>> + Send + Sync;

/// One fresh database of the backend under test, as the set-up of
/// [`conformance_suite!`](crate::conformance_suite) returns it for a case: how to open it
/// (again and again: a restarted process, a second worker pool), the label that names the
/// backend in failures and notes, and the backend's [`SqlFixtures`].
#[derive(Clone)]
pub struct TestDatabase {
    label: String,
    fixtures: SqlFixtures,
    open: Arc<Opener>,
}

impl TestDatabase {
    /// A database that `open` opens: each call returns a new [`Store`] on the same
    /// database (migrated, or migrating it on its first open), or the error that says why it
    /// cannot.
    ///
    /// ```
    /// use event_runtime::testing::conformance::{SqlFixtures, TestDatabase};
    /// use event_runtime::Store;
    ///
    /// let url = "sqlite://conformance.db".to_owned();
    /// let db = TestDatabase::new("my-sqlite", SqlFixtures::SQLITE, move || {
    ///     let url = url.clone();
    ///     async move { Store::connect(&url).await }
    /// });
    /// assert_eq!(db.label(), "my-sqlite");
    /// ```
    pub fn new<F, Fut, E>(label: impl Into<String>, fixtures: SqlFixtures, open: F) -> TestDatabase
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Store, E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        TestDatabase {
            label: label.into(),
            fixtures,
            open: Arc::new(move || {
                let opening = open();
                Box::pin(async move { opening.await.map_err(Into::into) })
            }),
        }
    }

    /// A database of a backend [`Store::connect_with`] knows (this crate's, or one added to
    /// its table), opened with `url` and `options` (PostgreSQL: a fresh
    /// [`schema`](ConnectOptions::schema) per case).
    pub fn connect(
        label: impl Into<String>,
        url: impl Into<String>,
        options: ConnectOptions,
        fixtures: SqlFixtures,
    ) -> TestDatabase {
        let url = url.into();
        TestDatabase::new(label, fixtures, move || {
            let (url, options) = (url.clone(), options.clone());
            async move { Store::connect_with(&url, &options).await }
        })
    }

    /// Opens a new store on the database.
    ///
    /// # Panics
    /// When it cannot be opened, with the label and the error's chain: the case fails.
    pub async fn open(&self) -> Store {
        (self.open)().await.unwrap_or_else(|e| {
            panic!(
                "{}: cannot open the test database: {}",
                self.label,
                event_core::ErrorChain(&*e)
            )
        })
    }

    /// The label that names the backend in failures and notes (`sqlite`, `postgres`…).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The backend's fixtures.
    pub fn fixtures(&self) -> &SqlFixtures {
        &self.fixtures
    }
}

impl fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("label", &self.label)
            .field("fixtures", &self.fixtures)
            .finish_non_exhaustive()
    }
}
