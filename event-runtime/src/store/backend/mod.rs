//! The store boundary: the two traits a database backend implements ([`Backend`] for the
//! store, [`BackendTransaction`] for one open transaction) and the rows that cross it. The
//! delivery engine, the unit of work and the `events` tool talk to a store only through these;
//! nothing here names a database.
//!
//! Applications never call these traits: they use [`Store`](crate::Store), [`Tx`] and the
//! [`Outbox`](crate::Outbox). They are public so that a backend can live outside this crate
//! and prove itself with the conformance suite (`event_runtime::testing::conformance`,
//! feature `testing`).
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

use async_trait::async_trait;
use uuid::Uuid;

use super::query::Row;
use super::types::{
    AuditEntry, Backlog, CatalogRecord, DeadLetter, DeadLetterCount, DeadLetterFilter,
    DestinationBacklog, OutboxStats, PausedDestination, Resolution,
};
use super::value::Datum;
use super::GroupView;
use super::InboxIdentity;
use super::{StoreError, Tx};
use crate::inbox::Origin;

mod rows;

pub use rows::{
    ChainLink, ClaimRequest, ClaimedDelivery, DestinationOperation, DestinationPage, Gap,
    InboxDeadLetter, LinkKind, Linked, NewEvent, Pause, PlaceQuery, ProbeClaim, ProbeRequest,
    PurgeStep, RelayChainKey, RepublishPage, RepublishSelection, RepublishStart,
    ResolutionSelection, Route, SettleOutcome, SettleResult, Settlement, TakenDeadLetter,
};

/// A database the outbox can live in.
///
/// Implemented by the SQLite and PostgreSQL backends of this crate. See the module docs for
/// the rules every implementation keeps.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// The backend's name (`sqlite`, `postgres`): logs, errors and [`Store::backend_name`](crate::Store::backend_name).
    fn name(&self) -> &'static str;

    /// The type ids of the native connection types a handler may take as its transaction
    /// parameter besides [`Tx`] (`sqlx::SqliteConnection`, `sqlx::PgConnection`).
    fn native_transaction_types(&self) -> Vec<TypeId>;

    /// This value, to reach a backend's own API (its pool).
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

    /// Writes or renews a pause.
    async fn pause(&self, pause: &Pause) -> Result<(), StoreError>;

    /// Lifts the pause of `destination` by `paused_by`. Returns whether there was one.
    async fn resume(&self, destination: &str, paused_by: &str) -> Result<bool, StoreError>;

    /// Every pause in force at `now`.
    async fn paused(&self, now: i64) -> Result<Vec<PausedDestination>, StoreError>;

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

    /// Dead letters matching `filter`, oldest first.
    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError>;

    /// Replays or purges the open dead letters `ids` in one transaction with one audit row,
    /// calling `progress(n)` after each of them.
    #[allow(clippy::too_many_arguments)]
    async fn resolve_dead_letters(
        &self,
        ids: &[i64],
        action: Resolution,
        actor: &str,
        reason: &str,
        now: i64,
        progress: &mut (dyn FnMut(usize) + Send),
    ) -> Result<AuditEntry, StoreError>;

    /// The audit log, newest first.
    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError>;

    /// Starts a replay or purge over the open dead letters `filter` selects (its `limit`
    /// caps the count; `include_resolved` is ignored): writes its audit row, unfinished,
    /// with the selection, which includes the newest dead letter id now (later ones are never
    /// touched). Returns the row and the selection.
    async fn start_resolution(
        &self,
        filter: &DeadLetterFilter,
        action: Resolution,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<(AuditEntry, ResolutionSelection), StoreError>;

    /// Resolves the next page of at most `page` open dead letters of `selection`, oldest
    /// first, in one transaction that also adds them to the audit row's count. Returns how
    /// many it selected (fewer than `page`: nothing is left) and how many it resolved.
    async fn resolve_page(
        &self,
        audit_id: i64,
        action: Resolution,
        selection: &ResolutionSelection,
        page: u32,
        now: i64,
    ) -> Result<(u64, u64), StoreError>;

    /// Marks the operation finished at `now`; returns its audit row.
    async fn finish_resolution(&self, audit_id: i64, now: i64) -> Result<AuditEntry, StoreError>;

    /// The operation over a selection with this audit id (row, action, selection), or `None`.
    async fn resolution(
        &self,
        audit_id: i64,
    ) -> Result<Option<(AuditEntry, Resolution, ResolutionSelection)>, StoreError>;

    /// How many dead letters match `filter`, ignoring its `limit`. The default lists them and
    /// counts; a backend with a query language overrides it with a count.
    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let mut filter = filter.clone();
        filter.limit = None;
        Ok(self.dead_letters(&filter).await?.len() as u64)
    }

    /// Open and resolved dead letters per (handler, event name), ordered by both. The default
    /// lists every dead letter and counts; a backend with a query language overrides it.
    async fn dead_letter_counts(&self) -> Result<Vec<DeadLetterCount>, StoreError> {
        let filter = DeadLetterFilter {
            include_resolved: true,
            ..DeadLetterFilter::default()
        };
        let mut counts: Vec<DeadLetterCount> = Vec::new();
        for d in self.dead_letters(&filter).await? {
            let i = match counts.binary_search_by(|c| {
                (&*c.handler, &*c.event_name).cmp(&(&*d.handler, &*d.event_name))
            }) {
                Ok(i) => i,
                Err(i) => {
                    counts.insert(
                        i,
                        DeadLetterCount {
                            handler: d.handler.clone(),
                            event_name: d.event_name.clone(),
                            open: 0,
                            resolved: 0,
                        },
                    );
                    i
                }
            };
            if d.resolved_at.is_none() {
                counts[i].open += 1;
            } else {
                counts[i].resolved += 1;
            }
        }
        Ok(counts)
    }

    /// Starts purging (`op.to` `None`) or re-targeting (`op.to` the new destination) what
    /// `op.from` left: refuses with [`StoreError::DestinationInUse`] when a delivery of
    /// `op.from` is leased under a live lease, and with [`StoreError::SameDestination`] when
    /// `op.to` is `op.from`; continues the unfinished operation with the same `op` if there is
    /// one (its audit row); else writes the operation's audit row, unfinished, with `op` as its
    /// selection. Returns the audit row.
    async fn start_destination_operation(
        &self,
        op: &DestinationOperation,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError>;

    /// One page of the operation, in one transaction that also adds what it did to the audit
    /// row's count (refused, changing nothing, with [`StoreError::DestinationInUse`] as the
    /// start is): at most `page` deliveries of `op.from` (pending or dead, in run order)
    /// with their open dead letters, or, when none is left, at most `page` of its open dead
    /// letters without a delivery. A purge marks the deliveries `purged` and resolves the
    /// dead letters as purged (naming the audit row). A re-target drops (as a purge does)
    /// those of events `op.to` has a delivery of already, moves the others onto `op.to` —
    /// each at its event's sequence (0 when `!op.ordered`), a pending one with its attempts
    /// reset and due at `now`, a dead one still dead, its dead letter moved with it — and
    /// recomputes the ready head of every run of `op.to` it merged into. Returns what the page
    /// did; `selected` 0 when nothing is left.
    async fn destination_page(
        &self,
        audit_id: i64,
        op: &DestinationOperation,
        page: u32,
        now: i64,
    ) -> Result<DestinationPage, StoreError>;

    /// Marks the operation finished at `now`; returns its audit row.
    async fn finish_destination_operation(
        &self,
        audit_id: i64,
        now: i64,
    ) -> Result<AuditEntry, StoreError>;

    /// Every pending delivery as (destination, event id, envelope).
    async fn pending_envelopes(&self) -> Result<Vec<(String, String, String)>, StoreError>;

    /// The names of the events `destination` left undelivered (those of its pending
    /// deliveries and open dead letters), sorted, each once.
    async fn undelivered_event_names(&self, destination: &str) -> Result<Vec<String>, StoreError>;

    /// `None` when `destination` has a delivery row; otherwise how many events named in
    /// `names` were recorded at or after `since` (ms), counted up to `cap`.
    async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since: i64,
        cap: u64,
    ) -> Result<Option<u64>, StoreError>;

    /// Pauses `destination` for the operator (`paused_by` `operator`, no expiry; a pause of
    /// the operator's already there keeps its start and takes `reason`) and appends an audit
    /// row (action `pause`, `actor`, reason `DESTINATION: REASON`), in one transaction.
    async fn pause_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError>;

    /// Lifts the operator's pause of `destination` and its circuit breaker's pause (`paused_by`
    /// `breaker`) and appends an audit row (action `resume`), in one transaction; `None`,
    /// writing nothing, when neither had paused it.
    async fn resume_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<Option<AuditEntry>, StoreError>;

    /// Renews `member`'s lease in `group` (joining it) and those of the partitions it holds
    /// that have not expired at `now`, to `expires`; deletes the members whose lease expired
    /// before `forget_before`; returns the group at `now`. One transaction.
    async fn group_beat(
        &self,
        group: &str,
        member: &str,
        now: i64,
        expires: i64,
        forget_before: i64,
    ) -> Result<GroupView, StoreError>;

    /// Gives `partition` of `group` to `member` until `expires` when nobody holds it at `now`
    /// or `member` does; whether it did.
    async fn claim_partition(
        &self,
        group: &str,
        partition: u32,
        member: &str,
        now: i64,
        expires: i64,
    ) -> Result<bool, StoreError>;

    /// Releases the partitions (all with `None`) `member` holds in `group`; with `leave`,
    /// deletes its row too. One transaction; how many were released.
    async fn release_partitions(
        &self,
        group: &str,
        member: &str,
        partitions: Option<&[u32]>,
        leave: bool,
    ) -> Result<u64, StoreError>;

    /// The members and partitions of `group` at `now`.
    async fn group_view(&self, group: &str, now: i64) -> Result<GroupView, StoreError>;

    /// The identity recorded for the transport inbox `inbox`.
    async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError>;

    /// Records `identity` (stamped `now`) when its inbox has none, or has one without a
    /// consumer on the same stream created at the same time; returns what is recorded after.
    async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
        now: i64,
    ) -> Result<InboxIdentity, StoreError>;

    /// Replaces the identity of `identity.inbox` and appends an audit row (action
    /// `inbox-adopt`, `actor`, `reason` as given), in one transaction.
    async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError>;

    /// Where the event `event_id` came from, when a transport's inbox received it (`None`
    /// for this service's own events, events received before origins were stored, and ids
    /// not in the outbox).
    async fn received_origin(&self, event_id: Uuid) -> Result<Option<Origin>, StoreError>;

    /// The relay chain rows of `keys` written at or after `fresh_after` (ms; an older row is
    /// expired and its chain restarts at 0): (the last sequence published, the predecessor
    /// it named) per key.
    async fn relay_chain(
        &self,
        keys: &[RelayChainKey],
        fresh_after: i64,
    ) -> Result<std::collections::HashMap<RelayChainKey, (u64, u64)>, StoreError>;

    /// Opens a gap for every held received event recorded at or before `older_than` (ms)
    /// whose predecessor did not arrive or was dead-lettered here, unless one is open for
    /// it; at most `limit`. Returns the gaps opened.
    async fn open_gaps(
        &self,
        older_than: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<Gap>, StoreError>;

    /// Gaps in id order: the open ones, or every one with `all`; ids above `after`, at most
    /// `limit`.
    async fn gaps(&self, all: bool, after: i64, limit: usize) -> Result<Vec<Gap>, StoreError>;

    /// Accepts the open gaps `ids` in one transaction under the audit row `audit_id` (written
    /// by [`start_audit`](Self::start_audit), its count raised by the gaps accepted): the
    /// missing places are skipped and the held events after them released in chain order.
    /// Returns the gaps accepted (a gap closed meanwhile is left out).
    async fn accept_gaps(
        &self,
        ids: &[i64],
        audit_id: i64,
        now: i64,
    ) -> Result<Vec<Gap>, StoreError>;

    /// Received events held now: waiting for a predecessor in their aggregate's chain.
    async fn held_events(&self) -> Result<u64, StoreError>;

    /// Deletes chain state older than `cutoff` (ms): relay rows of aggregates that published
    /// nothing since, places of received aggregates idle since (never a held or dead one);
    /// at most about `limit` rows per table. Returns the rows deleted.
    async fn purge_chains(&self, cutoff: i64, limit: usize) -> Result<u64, StoreError>;

    /// Appends an unfinished audit row (`action`, `actor`, `reason`, `selection` as given)
    /// for an operation that runs page by page; finish it with
    /// [`finish_resolution`](Self::finish_resolution).
    async fn start_audit(
        &self,
        action: &str,
        actor: &str,
        reason: &str,
        selection: Option<&str>,
        now: i64,
    ) -> Result<AuditEntry, StoreError>;

    /// Adds `n` to the count of the audit row `audit_id` (an operation in steps, one done).
    async fn add_to_audit_count(&self, audit_id: i64, n: u64) -> Result<(), StoreError>;

    /// Starts re-publishing `selection` (refused with [`StoreError::InvalidSelection`] when
    /// it names neither aggregates nor a time): continues the unfinished re-publish of the
    /// same selection if there is one (its audit row), else writes an audit row (action
    /// `relay-republish`, `selection` as JSON), unfinished. Counts the selected events whose
    /// delivery to the destination is pending or dead.
    async fn start_republish(
        &self,
        selection: &RepublishSelection,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<RepublishStart, StoreError>;

    /// One page of a re-publish, in one transaction that also adds to the audit row's count:
    /// at most `page` of the selected events, in event id order after `after`, whose delivery
    /// to the destination completed at or before `started` (ms: the audit row's time, so that
    /// what this re-publish made pending and the relay published again is not selected
    /// twice), made pending again — attempts reset, due at `now`, joined to their runs in
    /// sequence order (each run's ready head recomputed).
    async fn republish_page(
        &self,
        audit_id: i64,
        selection: &RepublishSelection,
        started: i64,
        after: &str,
        page: u32,
        now: i64,
    ) -> Result<RepublishPage, StoreError>;

    /// The sequences of `aggregate`'s events whose delivery to the relay `destination`
    /// completed (it published them), below `below`, highest first, at most `limit`: what a
    /// delivery published again after later events names as its predecessor.
    async fn published_sequences(
        &self,
        destination: &str,
        aggregate: (&str, &str),
        below: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StoreError>;

    /// Whether `error` (anywhere in its chain) is a deadlock or serialization failure of
    /// this database, which asks for the whole transaction to be retried.
    fn is_conflict(&self, error: &(dyn std::error::Error + 'static)) -> bool;
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
    /// replayed at `now`, appends one audit row (action `replay`, `actor`, `reason`, the ids
    /// marked) unless none was, and returns it with their bodies, in the order of `ids`. Ids
    /// that are not open inbox dead letters are skipped.
    async fn take_inbox_dead_letters(
        &mut self,
        ids: &[i64],
        inbox: Option<&str>,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<(Option<AuditEntry>, Vec<TakenDeadLetter>), StoreError>;

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

    /// Abandons the transaction as a killed process would (test builds): with
    /// `kill_connection`, the database connection is killed under it first.
    #[doc(hidden)]
    async fn abandon(self: Box<Self>, kill_connection: bool);
}
