//! The store boundary: the traits a database backend implements and the rows that cross it.
//! The delivery engine, the unit of work, the inbox and the `events` tool talk to a store only
//! through these; nothing here names a database.
//!
//! | trait | required | what |
//! |---|---|---|
//! | [`Backend`] | yes | the core the engine calls: migrate, begin, claim, renew and drop leases, settle, repair, progress, pauses, the breaker's probe, retention, gauges, catalog |
//! | [`ChainStore`] | yes (supertrait of `Backend`) | the chain state of the sequence-aware inbox and relay |
//! | [`BackendTransaction`] | yes | one open transaction: append events, insert deliveries, savepoints, in-transaction settlement, inbox dead letters, chain links, time limits |
//! | [`Inspection`] | no | dead letters, counts, the audit log, pending envelopes |
//! | [`DeadLetterOperations`] | no | replay and purge, by ids or paged over a selection |
//! | [`DestinationOperations`] | no | audited pause/resume, purge, re-target, re-publish |
//! | [`OperationLog`] | no | audit rows of paged operations |
//! | [`PartitionLeases`] | no | partition leases of transport instance groups |
//!
//! An optional trait is offered by overriding its accessor on [`Backend`]
//! (`fn inspection(&self) -> Option<&dyn Inspection> { Some(self) }`); without it the
//! operations built on it fail with [`StoreError::Unsupported`]
//! naming the trait, and everything else works.
//!
//! Applications never call these traits: they use [`Store`](crate::Store), [`Tx`] and the
//! [`Outbox`](crate::Outbox). They are public so that a backend can live outside this crate
//! ([`Store::from_backend`](crate::Store::from_backend)) and prove itself with the
//! conformance suite (`event_runtime::testing::conformance`, feature `testing`).
//!
//! # Implementing a backend
//! The traits are `async` through [`async_trait`](macro@async_trait), re-exported here
//! (event ids are `uuid::Uuid`, also `event_runtime::sqlx::types::Uuid`), so that a backend's
//! crate needs no dependency of its own for either:
//!
//! ```text
//! use event_runtime::store::backend::{async_trait, Backend, ChainStore, Inspection};
//!
//! #[async_trait]
//! impl Backend for MyStore { /* the core: migrate, begin, claim, settle, … */
//!     fn inspection(&self) -> Option<&dyn Inspection> { Some(self) } // offered
//! }
//! #[async_trait]
//! impl ChainStore for MyStore { /* required */ }
//! #[async_trait]
//! impl Inspection for MyStore { /* optional */ }
//!
//! let store = Store::from_backend(Arc::new(MyStore::new(..)));
//! ```
//!
//! A whole one, delegating to the SQLite store and offering the core only, is
//! `tests/tests/store_core_only.rs` in this crate's repository; it runs the conformance suite
//! with one line. Enable the feature `fault-injection` in the backend's dev-dependencies for
//! the suite's four crash cases, which are skipped without it.
//!
//! # Rules every backend keeps
//! - **Times** are milliseconds since the Unix epoch (UTC), always passed in by the caller
//!   (`now`): a backend never reads a clock, so that an injected clock drives every stamp.
//! - **Leases** belong to a worker: its first claim writes a lease row (in the claim's own
//!   transaction), which the worker renews ([`Backend::renew_lease`]) from its own connection,
//!   never backwards; a delivery is leased while its `lease_token` names a lease whose
//!   `expires_at` is not past. Renewing touches only the lease row, so it never waits on a
//!   batch transaction's row locks (where the database has one writer, a batch transaction
//!   renews its process's leases itself: [`BackendTransaction::renew_leases`]).
//! - **Runs**: of the pending deliveries of one (destination, aggregate) with a sequence
//!   above 0, only the lowest is *ready*; a claim takes ready heads whose earlier deliveries
//!   are all completed or purged and extends each into its run, in sequence order.
//! - **Fencing**: every settlement names the lease token it was claimed under; a row leased
//!   to another token is left alone and reported as [`SettleResult::LeaseLost`].
//! - **One bad row never fails the others**: [`Backend::settle`] returns one result per
//!   settlement, and a statement that fails for one row is contained to that row.

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use uuid::Uuid;

use super::query::Row;
use super::types::{Backlog, CatalogRecord, DestinationBacklog, OutboxStats, PausedDestination};
use super::value::Datum;
use super::{StoreError, Tx};

mod capabilities;
mod rows;

pub use async_trait::async_trait;

pub use capabilities::{
    ChainStore, DeadLetterOperations, DestinationOperations, Inspection, OperationLog,
    PartitionLeases,
};
pub use rows::{
    AuditStamp, ChainLink, ClaimRequest, ClaimedDelivery, DestinationOperation, DestinationPage,
    Gap, InboxDeadLetter, LinkKind, Linked, NewEvent, Pause, PendingEnvelope, PlaceQuery,
    ProbeClaim, ProbeRequest, PurgeStep, RelayChainKey, RelayChainState, RepublishPage,
    RepublishSelection, RepublishStart, ResolutionOperation, ResolutionSelection, ResolutionStart,
    ResolvedPage, Route, SettleOutcome, SettleResult, Settlement, TakenDeadLetter,
    TakenDeadLetters,
};

/// A database the outbox can live in: the core every backend implements, which the
/// delivery engine, the unit of work and the inbox call (claim, renew, settle, append through
/// [`BackendTransaction`], migrate, pauses, repair and progress, retention, backlog gauges)
/// plus the required [`ChainStore`]; the optional capabilities are reached through the
/// accessors at the end, which return `None` unless the backend overrides them.
///
/// Implemented by the SQLite and PostgreSQL backends of this crate. See the module docs for
/// the rules every implementation keeps.
#[async_trait]
pub trait Backend: ChainStore + Send + Sync + fmt::Debug + 'static {
    /// The backend's name (`sqlite`, `postgres`): logs, errors and [`Store::backend_name`](crate::Store::backend_name).
    fn name(&self) -> &'static str;

    /// The type ids of the native connection types a handler may take as its transaction
    /// parameter besides [`Tx`] (`sqlx::SqliteConnection`, `sqlx::PgConnection`).
    fn native_transaction_types(&self) -> Vec<TypeId>;

    /// This value, to reach a backend's own API: `store::sqlite::pool` and
    /// `store::postgres::pool` downcast it to their store. A backend that decorates another
    /// (metrics, logging around it) may return the inner one's, so that those keep working.
    fn as_any(&self) -> &dyn Any;

    /// Applies the outbox migrations not applied yet, in the outbox's own migrations table.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Whether the outbox tables exist (for opening an existing outbox without creating one).
    async fn has_outbox(&self) -> Result<bool, StoreError>;

    /// Begins a write transaction.
    async fn begin(&self) -> Result<Tx, StoreError>;

    /// Runs one statement with `$N` placeholders outside any transaction of the caller's;
    /// rows affected ([`Store::query`](crate::Store::query)). The default runs it in a
    /// transaction of its own.
    async fn execute(&self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let n = tx.backend().execute(sql, args).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Runs one query with `$N` placeholders outside any transaction of the caller's; its
    /// rows, or only the first with `first_only`. The default runs it in a transaction of
    /// its own.
    async fn fetch(
        &self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError> {
        let mut tx = self.begin().await?;
        let rows = tx.backend().fetch(sql, args, first_only).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Closes every connection.
    async fn close(&self);

    /// Whether `error` (anywhere in its chain) is a deadlock or serialization failure of
    /// this database, which asks for the whole transaction to be retried.
    fn is_conflict(&self, error: &(dyn std::error::Error + 'static)) -> bool;

    /// Extends lease `token` to `expires_at`, never shortening it. Returns false when nothing
    /// changed: no such row (the worker has claimed nothing yet, or its lease lapsed and was
    /// deleted), or a later expiry already.
    async fn renew_lease(&self, token: &str, expires_at: i64) -> Result<bool, StoreError>;

    /// Gives back every pending delivery leased to `token` (due as before, no attempt
    /// counted) and deletes the lease row. Returns the deliveries given back.
    async fn drop_lease(&self, token: &str) -> Result<u64, StoreError>;

    /// Leases ready runs of due deliveries to `req.token`, at most `req.max_runs` runs and
    /// `req.max_deliveries` deliveries, oldest heads first, skipping paused destinations and
    /// deliveries leased under a live lease. Returned in (destination, aggregate, sequence)
    /// order.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedDelivery>, StoreError>;

    /// Records `batch` in one short transaction, each settlement fenced by `token`; one
    /// result per settlement, in order.
    async fn settle(
        &self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError>;

    /// Makes ready the head of every run that has none (a commit or settlement that ended
    /// before its own promotion ran), and deletes lease rows that expired before
    /// `expired_before` and hold no delivery. Returns how many deliveries it made ready.
    async fn repair_runs(&self, expired_before: i64) -> Result<u64, StoreError>;

    /// Runs of `destinations` that can still progress: pending heads (due now or later) of
    /// destinations not paused — a circuit breaker's pause (`paused_by` `breaker`) does not
    /// count, as it lifts by itself. A run whose head is dead waits for its replay or purge and
    /// does not count.
    async fn progressing(&self, destinations: &[String]) -> Result<u64, StoreError>;

    /// Takes the probe of the circuit breaker's pause of `req.destination` (`paused_by`
    /// `breaker`) when its `probe_at` has come, in one transaction: moves `probe_at` to
    /// `req.probe_until` and writes `req.token` as its holder (so that exactly one worker
    /// store-wide takes it, and another takes it again if that one dies), then leases to
    /// `req.token` the oldest ready head of the destination whether its retry is due or not
    /// (one delivery, never a run: the probe). Another pause of the destination in force
    /// (an operator's) holds the probe back.
    ///
    /// Returns [`ProbeClaim::NotDue`] (nothing written) when there is no breaker pause, its
    /// probe is not due or another pause holds it; [`ProbeClaim::Nothing`] when the
    /// destination has no delivery to probe with (the breaker's pause is then lifted, in the
    /// same transaction); else [`ProbeClaim::Claimed`].
    async fn claim_probe(&self, req: &ProbeRequest<'_>) -> Result<ProbeClaim, StoreError>;

    /// Writes or renews a pause.
    async fn pause(&self, pause: &Pause) -> Result<(), StoreError>;

    /// Lifts the pause of `destination` by `paused_by`. Returns whether there was one.
    async fn resume(&self, destination: &str, paused_by: &str) -> Result<bool, StoreError>;

    /// Every pause in force at `now`.
    async fn paused(&self, now: i64) -> Result<Vec<PausedDestination>, StoreError>;

    /// One bounded step of the retention purge, in one short transaction: deletes up to
    /// `batch` deliveries completed before `cutoff`, then up to `batch` outbox rows recorded
    /// before `cutoff` that no delivery and no open dead letter refers to. Never touches a
    /// pending, leased or dead delivery. One purger at a time across processes: a step that
    /// finds another purger running deletes nothing and says so (`PurgeStep::busy`).
    async fn purge_completed(&self, cutoff: i64, batch: u32) -> Result<PurgeStep, StoreError>;

    /// Refreshes planner statistics, where the database needs it. Default: nothing.
    async fn refresh_statistics(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Backlog and dead letter counts at `now`.
    async fn stats(&self, now: i64) -> Result<OutboxStats, StoreError>;

    /// What the workers' gauges show at `now` (ms since the epoch): pending deliveries per
    /// destination with the age of each one's oldest, open dead letters, pauses. Read by every
    /// worker process every
    /// [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval), so it
    /// must be cheap: a backend with a query language overrides it with queries that read
    /// only pending deliveries (an index of them) and open dead letters. The default derives
    /// it from [`stats`](Self::stats), which reads every delivery, and gives each destination
    /// the outbox's oldest pending age (an upper bound of its own).
    async fn backlog(&self, now: i64) -> Result<Backlog, StoreError> {
        let stats = self.stats(now).await?;
        let oldest = stats.oldest_pending_age_secs.unwrap_or(0.0);
        Ok(Backlog {
            destinations: stats
                .handlers
                .iter()
                .filter(|h| h.pending > 0)
                .map(|h| DestinationBacklog {
                    destination: h.handler.clone(),
                    pending: h.pending,
                    oldest_pending_age_secs: oldest,
                })
                .collect(),
            dead_letters: stats.dead_letters,
            paused: stats
                .handlers
                .iter()
                .filter(|h| h.paused)
                .map(|h| h.handler.clone())
                .collect(),
            held: self.held_events().await?,
            open_gaps: self.gaps(false, 0, 1_000_000).await?.len() as u64,
        })
    }

    /// Records `entries` in the catalog table (`event_catalog`), each replacing the row of
    /// its (name, version), at `now` (ms), in one transaction. Default: nothing (a backend
    /// without the catalog; the standalone tool then knows no sensitive field).
    async fn record_catalog(&self, entries: &[CatalogRecord], now: i64) -> Result<(), StoreError> {
        let _ = (entries, now);
        Ok(())
    }

    /// The catalog table, by name then version. Default: empty.
    async fn catalog(&self) -> Result<Vec<CatalogRecord>, StoreError> {
        Ok(Vec::new())
    }

    /// Reading dead letters, the audit log and what is pending ([`Inspection`]), if this
    /// backend offers it. Default: `None` (listing then fails with
    /// [`StoreError::Unsupported`] naming `Inspection`).
    fn inspection(&self) -> Option<&dyn Inspection> {
        None
    }

    /// Replaying and purging dead letters ([`DeadLetterOperations`]), if offered. Default:
    /// `None`.
    fn dead_letter_operations(&self) -> Option<&dyn DeadLetterOperations> {
        None
    }

    /// Operators' work on a destination: audited pauses, purge, re-target, re-publish
    /// ([`DestinationOperations`]), if offered. Default: `None`.
    fn destination_operations(&self) -> Option<&dyn DestinationOperations> {
        None
    }

    /// Audit rows of operations that run page by page ([`OperationLog`]), if offered; the
    /// dead-letter, destination and gap operations need it. Default: `None`.
    fn operation_log(&self) -> Option<&dyn OperationLog> {
        None
    }

    /// Leases of a transport's partitions among an instance group ([`PartitionLeases`]), if
    /// offered. Default: `None` (a group then refuses to start, naming the capability).
    fn partition_leases(&self) -> Option<&dyn PartitionLeases> {
        None
    }
}

/// One open transaction of a [`Backend`], behind a [`Tx`].
#[async_trait]
pub trait BackendTransaction: Send + fmt::Debug {
    /// Commits.
    async fn commit(self: Box<Self>) -> Result<(), StoreError>;

    /// Rolls back.
    async fn rollback(self: Box<Self>) -> Result<(), StoreError>;

    /// Runs one statement with `$N` placeholders (a number may repeat); rows affected. Each
    /// [`Datum`] is bound the way this database stores it: what one backend writes, every
    /// other reads back equal (see [`Tx::query`]).
    async fn execute(&mut self, sql: &str, args: &[Datum]) -> Result<u64, StoreError>;

    /// Runs one query with `$N` placeholders; its rows, or only the first with
    /// `first_only`, each column decoded into the [`Datum`] it stores (a type with no
    /// portable reading as [`Datum::Unsupported`]).
    async fn fetch(
        &mut self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError>;

    /// Appends outbox rows; returns the ids that were new (an id already present is
    /// skipped). A second event with the same (aggregate, sequence) is
    /// [`StoreError::Conflict`] naming the rejected row.
    async fn append_events(
        &mut self,
        events: &[NewEvent],
        now: i64,
    ) -> Result<HashSet<Uuid>, StoreError>;

    /// Writes one delivery row per (event, route), due at `now`, the head of each run ready.
    async fn insert_deliveries(&mut self, events: &[&NewEvent], now: i64)
        -> Result<(), StoreError>;

    /// `SAVEPOINT name`.
    async fn savepoint(&mut self, name: &str) -> Result<(), StoreError>;

    /// `RELEASE SAVEPOINT name`.
    async fn release_savepoint(&mut self, name: &str) -> Result<(), StoreError>;

    /// `ROLLBACK TO SAVEPOINT name` (the savepoint stays).
    async fn rollback_to_savepoint(&mut self, name: &str) -> Result<(), StoreError>;

    /// Records `batch` inside this transaction, each in its own savepoint, fenced by
    /// `token`: committed with the transaction, undone with it.
    async fn settle(
        &mut self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError>;

    /// Records one completion inside this transaction, fenced by `token`, without a
    /// savepoint of its own (the caller's savepoint holds the handler's writes and this
    /// record together). The next delivery of its run is made ready at COMMIT.
    async fn complete(
        &mut self,
        token: &str,
        now: i64,
        settlement: &Settlement<'_>,
    ) -> Result<SettleResult, StoreError>;

    /// Writes `letter` to the dead letter queue unless the inbox has a dead letter of that
    /// event id already (a redelivery of a message dead-lettered before): whether it wrote.
    async fn insert_inbox_dead_letter(
        &mut self,
        letter: &InboxDeadLetter,
        now: i64,
    ) -> Result<bool, StoreError>;

    /// Marks the open inbox dead letters among `ids` (of the inbox `inbox` only, when given)
    /// replayed at `stamp.at`, appends one audit row (action `replay`, stamped with `stamp`,
    /// the ids marked) unless none was, and returns it with their bodies, in the order of
    /// `ids`. Ids that are not open inbox dead letters are skipped.
    async fn take_inbox_dead_letters(
        &mut self,
        ids: &[i64],
        inbox: Option<&str>,
        stamp: &AuditStamp<'_>,
    ) -> Result<TakenDeadLetters, StoreError>;

    /// The indexes of the `places` the outbox holds under another event id.
    async fn held_places(&mut self, places: &[PlaceQuery<'_>]) -> Result<Vec<usize>, StoreError>;

    /// Links received events and dead letters into their aggregates' chains and releases
    /// what can be released (see [`LinkKind`]); the deliveries inserted after this call in
    /// this transaction for an event that stays held are held (part of their run, never
    /// ready), and the runs of deliveries released are made ready at commit. Two
    /// transactions linking one aggregate run one after the other.
    async fn link(&mut self, links: &[ChainLink], now: i64) -> Result<Linked, StoreError>;

    /// The indexes of the `places` (aggregate type, aggregate id, sequence) whose gap an
    /// operator accepted: an event arriving there is late.
    async fn skipped_places(
        &mut self,
        places: &[(&str, &str, u64)],
    ) -> Result<Vec<usize>, StoreError>;

    /// Extends the leases `tokens` (this process's live workers) to `expires_at` inside this
    /// transaction, where the database has a single writer (SQLite): while this transaction
    /// holds the write lock, no worker can renew its own lease, and a lease that lapsed
    /// meanwhile would let another worker take over deliveries a live worker is running. A
    /// no-op where renewals do not wait for writers (PostgreSQL: there it would lock the lease
    /// rows against their own workers' renewals).
    async fn renew_leases(&mut self, tokens: &[String], expires_at: i64) -> Result<(), StoreError>;

    /// Limits how long each following statement may run (`None`: no limit), so that a
    /// handler's time limit also stops a statement it left running in the database. Returns
    /// whether the backend can.
    async fn set_time_limit(&mut self, limit: Option<Duration>) -> Result<bool, StoreError>;

    /// The native connection as `type_id`, when it is that type.
    fn native(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)>;

    /// Fault injection (feature `fault-injection`, for crash tests only): abandons the
    /// transaction as a killed process would; with `kill_connection`, the database
    /// connection is killed under it first. The default drops it (a rollback), which is
    /// what a backend that cannot kill its connection offers.
    #[cfg(feature = "fault-injection")]
    async fn abandon(self: Box<Self>, kill_connection: bool) {
        let _ = kill_connection;
    }
}
