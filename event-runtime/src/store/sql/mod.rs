//! The outbox over an sqlx driver, shared by the SQL backends: [`SqlStore`] implements
//! [`Backend`] and [`SqlTx`] implements [`BackendTransaction`] once, generically, with the
//! statements every supported dialect accepts; what differs (connecting, claiming, time
//! limits, error codes) comes from the backend's [`Dialect`]. Names no database itself.

pub(crate) mod append;
pub(crate) mod audit;
pub(crate) mod claim;
pub(crate) mod dead_letters;
pub(crate) mod delivery;
pub(crate) mod exec;
pub(crate) mod inbox;
pub(crate) mod maintenance;
pub(crate) mod operator;
mod portable;
pub(crate) mod resolution;
pub(crate) mod retarget;

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::{Database, Pool};
use uuid::Uuid;

use self::exec::{Arg, SqlExec, SqlxQuery};
use self::portable::{portable_execute, portable_fetch};
use super::backend::{
    Backend, BackendTransaction, ClaimRequest, ClaimedDelivery, DestinationOperation,
    DestinationPage, InboxDeadLetter, NewEvent, Pause, PlaceQuery, PurgeStep, ResolutionSelection,
    SettleResult, Settlement, TakenDeadLetter,
};
use super::query::Row;
use super::types::{
    AuditEntry, Backlog, DeadLetter, DeadLetterCount, DeadLetterFilter, OutboxStats,
    PausedDestination, Resolution,
};
use super::value::Datum;
use super::{DatabaseError, InboxIdentity, StoreError, Tx};
use crate::inbox::Origin;

/// The connection type of a dialect's driver.
pub(crate) type Conn<D> = <<D as Dialect>::DB as Database>::Connection;

/// The table the outbox records its own migrations in, apart from the application's
/// `_sqlx_migrations`.
pub(crate) const MIGRATIONS_TABLE: &str = "_event_outbox_migrations";

/// What one SQL database does its own way. Implemented by each SQL backend module, which
/// owns its dialect's statements and migrations.
pub(crate) trait Dialect: Send + Sync + Sized + fmt::Debug + 'static {
    /// The sqlx driver.
    type DB: SqlExec;

    /// The backend name (`sqlite`, `postgres`).
    const NAME: &'static str;

    /// Whether writers are serialised by the database (one write transaction at a time):
    /// then a batch transaction renews its process's leases itself (see
    /// [`BackendTransaction::renew_leases`]).
    const SINGLE_WRITER: bool;

    /// Whether a commit or settlement promotes run heads again after COMMIT: needed where
    /// concurrent transactions do not see each other's uncommitted rows and may both decide
    /// that the other's row is not the head (PostgreSQL's READ COMMITTED). Not needed where
    /// writers are serialised (SQLite).
    const PROMOTE_AFTER_COMMIT: bool;

    /// The statement that lets a transaction commit without waiting for durable storage
    /// (PostgreSQL `SET LOCAL synchronous_commit = off`), for bookkeeping whose loss in a
    /// database crash is harmless; `None` where commits are cheap anyway.
    const RELAXED_COMMIT: Option<&'static str>;

    /// Rows affected by a statement.
    fn rows_affected(result: &<Self::DB as Database>::QueryResult) -> u64;

    /// Begins a write transaction.
    fn begin(
        pool: &Pool<Self::DB>,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::DB>, sqlx::Error>> + Send;

    /// The bundled migrations, recorded in [`MIGRATIONS_TABLE`].
    fn migrator() -> Migrator;

    /// Applies [`migrator`](Self::migrator)'s migrations not applied yet, one process at a
    /// time, after moving the outbox's migration rows out of sqlx's default
    /// `_sqlx_migrations` table (where release 0.1.0 recorded them) into
    /// [`MIGRATIONS_TABLE`].
    fn migrate(pool: &Pool<Self::DB>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The deliveries table as `d` in the claim's scan of ready heads, with whatever hint the
    /// planner needs to scan the ready index in due order rather than every delivery of the
    /// claimed destinations.
    const HEADS_TABLE: &'static str;

    /// A condition on the delivery row `d` that holds when the engine cannot read one of its
    /// columns the way it wrote it, beyond what every dialect checks alike (a negative
    /// sequence, a missing outbox row): a value of another type where the database lets one
    /// in, an event id that is not a lower-case hyphenated UUID.
    const UNREADABLE_DELIVERY: &'static str;

    /// A subquery yielding the text elements of the JSON array in placeholder `param`.
    fn json_text_array(param: &str) -> String;

    /// `column` is one of the texts of the JSON array in placeholder `param`, as a condition
    /// the planner turns into lookups by key (or one hashed pass), never into a scan of the
    /// table per listed value.
    fn text_in(column: &str, param: &str) -> String;

    /// Leases ready runs (see [`Backend::claim`]).
    fn claim(
        pool: &Pool<Self::DB>,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedDelivery>, StoreError>> + Send;

    /// What a transaction keeps of its statement time limit between calls.
    type TimeLimit: Send + Default + 'static;

    /// Limits the running time of each following statement on `conn` (`None`: no limit),
    /// keeping what it needs in `state`. Returns whether the dialect can.
    fn set_time_limit(
        conn: &mut Conn<Self>,
        state: &mut Self::TimeLimit,
        limit: Option<Duration>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The outbox tables were not found: the database error that explains it when it is not
    /// their absence (PostgreSQL silently skips a schema of the `search_path` that the user
    /// may not use, so a missing privilege looks like missing tables), else `Ok`.
    fn why_no_outbox(
        pool: &Pool<Self::DB>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = pool;
        async { Ok(()) }
    }

    /// Takes the purger's lock for the transaction on `conn`; false when another holds it.
    fn lock_purger(conn: &mut Conn<Self>)
        -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Refreshes the planner statistics of the deliveries table, if the database needs it.
    fn refresh_statistics(
        pool: &Pool<Self::DB>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// A deadlock or serialization failure: the database asks for the whole transaction to
    /// be retried.
    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool;

    /// Kills the database connection under `conn` (fault injection).
    fn kill(conn: &mut Conn<Self>) -> impl Future<Output = ()> + Send;

    /// Binds the next placeholder of `q` to `value`, stored the way this database keeps that
    /// type (the portable API: what one dialect writes, every other reads back equal).
    fn bind<'q>(q: SqlxQuery<'q, Self::DB>, value: &Datum) -> SqlxQuery<'q, Self::DB>;

    /// Column `index` of `row` as the datum it holds.
    fn datum(row: &<Self::DB as Database>::Row, index: usize) -> Datum;
}

/// An outbox store over one sqlx pool of dialect `D`.
pub(crate) struct SqlStore<D: Dialect> {
    pub(crate) pool: Pool<D::DB>,
}

impl<D: Dialect> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &D::NAME)
            .field("connections", &self.pool.size())
            .finish()
    }
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn new(pool: Pool<D::DB>) -> Self {
        SqlStore { pool }
    }
}

pub(crate) fn db(e: sqlx::Error) -> StoreError {
    StoreError::from(e)
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError::Migrate(e)
    }
}

/// sqlx's message for `e`, once: sqlx prints a cause inside its own message *and* returns it
/// as the source, so [`StoreError::Database`] prints this and has no source. A database's
/// refusal is its own message, without sqlx's `error returned from database: `.
pub(crate) fn sqlx_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.to_string(),
        sqlx::Error::Migrate(m) => migrate_message(m),
        other => other.to_string(),
    }
}

/// As [`sqlx_message`], for [`StoreError::Migrate`].
pub(crate) fn migrate_message(e: &sqlx::migrate::MigrateError) -> String {
    use sqlx::migrate::MigrateError;
    match e {
        MigrateError::Execute(e) => format!("while executing migrations: {}", sqlx_message(e)),
        MigrateError::ExecuteMigration(e, version) => {
            format!("while executing migration {version}: {}", sqlx_message(e))
        }
        other => other.to_string(),
    }
}

/// Deliveries named by (destination, event id), grouped by destination: one statement per
/// destination and chunk, each `handler = $a AND event_id IN (…)` on the primary key.
pub(crate) fn by_destination<'a>(
    keys: impl Iterator<Item = (&'a str, &'a str)>,
) -> Vec<(&'a str, String)> {
    let mut groups: Vec<(&'a str, Vec<&'a str>)> = Vec::new();
    for (destination, event_id) in keys {
        match groups.iter_mut().find(|(d, _)| *d == destination) {
            Some((_, ids)) => ids.push(event_id),
            None => groups.push((destination, vec![event_id])),
        }
    }
    groups
        .into_iter()
        .flat_map(|(d, ids)| {
            ids.chunks(1_000)
                .map(|c| (d, serde_json::to_string(c).unwrap_or_else(|_| "[]".into())))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Begins a transaction whose COMMIT need not wait for durable storage: for bookkeeping whose
/// loss in a database crash is harmless — leases, run promotions, the outcomes of deliveries
/// made outside any transaction (lost, those deliveries run again: at-least-once).
pub(crate) async fn begin_relaxed<D: Dialect>(
    pool: &Pool<D::DB>,
) -> Result<sqlx::Transaction<'static, D::DB>, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    if let Some(sql) = D::RELAXED_COMMIT {
        execute::<D>(&mut tx, sql, &[]).await?;
    }
    Ok(tx)
}

/// Promotes run heads again after a COMMIT (see [`Dialect::PROMOTE_AFTER_COMMIT`]).
pub(crate) async fn promote_after_commit<D: Dialect>(
    pool: &Pool<D::DB>,
    streams: &[append::StreamKey],
) -> Result<(), StoreError> {
    let mut tx = begin_relaxed::<D>(pool).await?;
    append::promote::<D>(&mut tx, streams).await?;
    tx.commit().await.map_err(db)
}

/// Runs `sql` on `conn`; rows affected.
pub(crate) async fn execute<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<u64, StoreError> {
    let r = D::DB::exec(conn, sql, args).await.map_err(db)?;
    Ok(D::rows_affected(&r))
}

/// Runs `sql` on `conn`; every row.
pub(crate) async fn rows<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<Vec<<D::DB as Database>::Row>, StoreError> {
    D::DB::rows(conn, sql, args).await.map_err(db)
}

#[async_trait]
impl<D: Dialect> Backend for SqlStore<D> {
    fn name(&self) -> &'static str {
        D::NAME
    }

    fn native_transaction_types(&self) -> Vec<TypeId> {
        vec![TypeId::of::<Conn<D>>()]
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        D::migrate(&self.pool).await
    }

    async fn has_outbox(&self) -> Result<bool, StoreError> {
        maintenance::has_outbox::<D>(&self.pool).await
    }

    async fn execute(&self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        portable_execute::<D>(&mut conn, sql, args).await
    }

    async fn fetch(
        &self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        portable_fetch::<D>(&mut conn, sql, args, first_only).await
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        let tx = D::begin(&self.pool).await.map_err(db)?;
        Ok(Tx::from_backend(Box::new(SqlTx::<D> {
            tx: Some(tx),
            pool: self.pool.clone(),
            promote_after_commit: Vec::new(),
            time_limit: D::TimeLimit::default(),
            completed_runs: Vec::new(),
        })))
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn renew_lease(&self, token: &str, expires_at: i64) -> Result<bool, StoreError> {
        delivery::renew_lease::<D>(&self.pool, token, expires_at).await
    }

    async fn drop_lease(&self, token: &str) -> Result<u64, StoreError> {
        delivery::drop_lease::<D>(&self.pool, token).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedDelivery>, StoreError> {
        D::claim(&self.pool, req).await
    }

    async fn settle(
        &self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError> {
        // The whole batch in one statement per kind first; if the database refuses one of
        // them, again with each settlement contained in its own savepoint, so that one row
        // the database refuses cannot keep the others from being recorded.
        let mut tx = begin_relaxed::<D>(&self.pool).await?;
        let (results, streams) =
            match delivery::settle::<D>(&mut tx, token, now, batch, false).await {
                Ok(done) => done,
                Err(_) => {
                    drop(tx);
                    tx = begin_relaxed::<D>(&self.pool).await?;
                    delivery::settle::<D>(&mut tx, token, now, batch, true).await?
                }
            };
        tx.commit().await.map_err(db)?;
        if D::PROMOTE_AFTER_COMMIT && !streams.is_empty() {
            promote_after_commit::<D>(&self.pool, &streams).await?;
        }
        Ok(results)
    }

    async fn repair_runs(&self, expired_before: i64) -> Result<u64, StoreError> {
        delivery::repair_runs::<D>(&self.pool, expired_before).await
    }

    async fn progressing(&self, destinations: &[String]) -> Result<u64, StoreError> {
        delivery::progressing::<D>(&self.pool, destinations).await
    }

    async fn pause(&self, pause: &Pause) -> Result<(), StoreError> {
        delivery::pause::<D>(&self.pool, pause).await
    }

    async fn resume(&self, destination: &str, paused_by: &str) -> Result<bool, StoreError> {
        delivery::resume::<D>(&self.pool, destination, paused_by).await
    }

    async fn paused(&self, now: i64) -> Result<Vec<PausedDestination>, StoreError> {
        delivery::paused::<D>(&self.pool, now).await
    }

    async fn purge_completed(&self, cutoff: i64, batch: u32) -> Result<PurgeStep, StoreError> {
        maintenance::purge_completed::<D>(&self.pool, cutoff, batch).await
    }

    async fn refresh_statistics(&self) -> Result<(), StoreError> {
        D::refresh_statistics(&self.pool).await.map_err(db)
    }

    async fn stats(&self, now: i64) -> Result<OutboxStats, StoreError> {
        maintenance::stats::<D>(&self.pool, now).await
    }

    async fn backlog(&self, now: i64) -> Result<Backlog, StoreError> {
        maintenance::backlog::<D>(&self.pool, now).await
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError> {
        dead_letters::list::<D>(&self.pool, filter).await
    }

    async fn resolve_dead_letters(
        &self,
        ids: &[i64],
        action: Resolution,
        actor: &str,
        reason: &str,
        now: i64,
        progress: &mut (dyn FnMut(usize) + Send),
    ) -> Result<AuditEntry, StoreError> {
        let mut tx = D::begin(&self.pool).await.map_err(db)?;
        let (entry, streams) =
            dead_letters::resolve::<D>(&mut tx, ids, action, actor, reason, now, progress).await?;
        tx.commit().await.map_err(db)?;
        if D::PROMOTE_AFTER_COMMIT && !streams.is_empty() {
            promote_after_commit::<D>(&self.pool, &streams).await?;
        }
        Ok(entry)
    }

    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        dead_letters::audit_log::<D>(&self.pool, limit).await
    }

    async fn start_resolution(
        &self,
        filter: &DeadLetterFilter,
        action: Resolution,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<(AuditEntry, ResolutionSelection), StoreError> {
        resolution::start::<D>(&self.pool, filter, action, actor, reason, now).await
    }

    async fn resolve_page(
        &self,
        audit_id: i64,
        action: Resolution,
        selection: &ResolutionSelection,
        page: u32,
        now: i64,
    ) -> Result<(u64, u64), StoreError> {
        resolution::page::<D>(&self.pool, audit_id, action, selection, page, now).await
    }

    async fn finish_resolution(&self, audit_id: i64, now: i64) -> Result<AuditEntry, StoreError> {
        resolution::finish::<D>(&self.pool, audit_id, now).await
    }

    async fn resolution(
        &self,
        audit_id: i64,
    ) -> Result<Option<(AuditEntry, Resolution, ResolutionSelection)>, StoreError> {
        resolution::load::<D>(&self.pool, audit_id).await
    }

    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        operator::count_dead_letters::<D>(&self.pool, filter).await
    }

    async fn dead_letter_counts(&self) -> Result<Vec<DeadLetterCount>, StoreError> {
        operator::dead_letter_counts::<D>(&self.pool).await
    }

    async fn start_destination_operation(
        &self,
        op: &DestinationOperation,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError> {
        retarget::start::<D>(&self.pool, op, actor, reason, now).await
    }

    async fn destination_page(
        &self,
        audit_id: i64,
        op: &DestinationOperation,
        page: u32,
        now: i64,
    ) -> Result<DestinationPage, StoreError> {
        retarget::page::<D>(&self.pool, audit_id, op, page, now).await
    }

    async fn finish_destination_operation(
        &self,
        audit_id: i64,
        now: i64,
    ) -> Result<AuditEntry, StoreError> {
        resolution::finish::<D>(&self.pool, audit_id, now).await
    }

    async fn undelivered_event_names(&self, destination: &str) -> Result<Vec<String>, StoreError> {
        retarget::undelivered_event_names::<D>(&self.pool, destination).await
    }

    async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since: i64,
        cap: u64,
    ) -> Result<Option<u64>, StoreError> {
        operator::unrouted_events::<D>(&self.pool, destination, names, since, cap).await
    }

    async fn pause_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError> {
        operator::pause_audited::<D>(&self.pool, destination, actor, reason, now).await
    }

    async fn resume_audited(
        &self,
        destination: &str,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<Option<AuditEntry>, StoreError> {
        operator::resume_audited::<D>(&self.pool, destination, actor, reason, now).await
    }

    async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        inbox::identity::<D>(&mut conn, inbox).await
    }

    async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
        now: i64,
    ) -> Result<InboxIdentity, StoreError> {
        inbox::record_identity::<D>(&self.pool, identity, now).await
    }

    async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<AuditEntry, StoreError> {
        inbox::adopt_identity::<D>(&self.pool, identity, actor, reason, now).await
    }

    async fn received_origin(&self, event_id: Uuid) -> Result<Option<Origin>, StoreError> {
        inbox::received_origin::<D>(&self.pool, event_id).await
    }

    async fn pending_envelopes(&self) -> Result<Vec<(String, String, String)>, StoreError> {
        dead_letters::pending_envelopes::<D>(&self.pool).await
    }

    fn is_conflict(&self, error: &(dyn std::error::Error + 'static)) -> bool {
        event_core::ErrorChain(error).into_iter().any(|e| {
            let sqlx = match e.downcast_ref::<StoreError>() {
                Some(StoreError::Database(d)) => Some(d.sqlx()),
                _ => e
                    .downcast_ref::<DatabaseError>()
                    .map(DatabaseError::sqlx)
                    .or_else(|| e.downcast_ref::<sqlx::Error>()),
            };
            let db = match sqlx {
                Some(sqlx::Error::Database(db)) => Some(db),
                _ => None,
            };
            db.is_some_and(|db| D::is_conflict(db.as_ref()))
        })
    }
}

/// One open transaction of a [`SqlStore`].
pub(crate) struct SqlTx<D: Dialect> {
    /// `None` once committed or rolled back.
    tx: Option<sqlx::Transaction<'static, D::DB>>,
    /// For what must run outside the transaction: the conflict lookup after a refused insert,
    /// promotions after COMMIT.
    pool: Pool<D::DB>,
    /// Runs to promote again after COMMIT ([`Dialect::PROMOTE_AFTER_COMMIT`]).
    promote_after_commit: Vec<append::StreamKey>,
    /// The statement time limit's state.
    time_limit: D::TimeLimit,
    /// Runs whose head completed in this transaction: promoted once, before COMMIT.
    completed_runs: Vec<append::StreamKey>,
}

impl<D: Dialect> fmt::Debug for SqlTx<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("backend", &D::NAME)
            .field("open", &self.tx.is_some())
            .finish()
    }
}

impl<D: Dialect> SqlTx<D> {
    fn conn(&mut self) -> &mut Conn<D> {
        // A `SqlTx` is only reachable through `Tx`, which consumes it on commit or rollback.
        self.tx
            .as_mut()
            .expect("transaction used after commit or rollback")
    }
}

fn check_savepoint(name: &str) -> Result<(), StoreError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
    {
        return Err(StoreError::InvalidSavepointName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[async_trait]
impl<D: Dialect> BackendTransaction for SqlTx<D> {
    async fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        if !self.completed_runs.is_empty() {
            let mut runs = std::mem::take(&mut self.completed_runs);
            runs.sort();
            runs.dedup();
            let heads = append::promote::<D>(self.conn(), &runs).await?;
            self.promote_after_commit
                .extend(runs.into_iter().filter(|r| !heads.contains_key(r)));
        }
        let tx = self.tx.take().expect("committed once");
        tx.commit().await.map_err(db)?;
        if D::PROMOTE_AFTER_COMMIT && !self.promote_after_commit.is_empty() {
            promote_after_commit::<D>(&self.pool, &self.promote_after_commit).await?;
        }
        Ok(())
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), StoreError> {
        let tx = self.tx.take().expect("rolled back once");
        tx.rollback().await.map_err(db)
    }

    async fn execute(&mut self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        portable_execute::<D>(self.conn(), sql, args).await
    }

    async fn fetch(
        &mut self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError> {
        portable_fetch::<D>(self.conn(), sql, args, first_only).await
    }

    async fn append_events(
        &mut self,
        events: &[NewEvent],
        now: i64,
    ) -> Result<HashSet<Uuid>, StoreError> {
        let pool = self.pool.clone();
        append::append_events::<D>(self.conn(), &pool, events, now).await
    }

    async fn insert_deliveries(
        &mut self,
        events: &[&NewEvent],
        now: i64,
    ) -> Result<(), StoreError> {
        let waiting = append::insert_deliveries::<D>(self.conn(), events, now).await?;
        self.promote_after_commit.extend(waiting);
        Ok(())
    }

    async fn insert_inbox_dead_letter(
        &mut self,
        letter: &InboxDeadLetter,
        now: i64,
    ) -> Result<bool, StoreError> {
        inbox::insert_dead_letter::<D>(self.conn(), letter, now).await
    }

    async fn take_inbox_dead_letters(
        &mut self,
        ids: &[i64],
        inbox: Option<&str>,
        actor: &str,
        reason: &str,
        now: i64,
    ) -> Result<(Option<AuditEntry>, Vec<TakenDeadLetter>), StoreError> {
        inbox::take_dead_letters::<D>(self.conn(), ids, inbox, actor, reason, now).await
    }

    async fn held_places(&mut self, places: &[PlaceQuery<'_>]) -> Result<Vec<usize>, StoreError> {
        append::held_places::<D>(self.conn(), places).await
    }

    async fn savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn release_savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("RELEASE SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self, name: &str) -> Result<(), StoreError> {
        check_savepoint(name)?;
        execute::<D>(self.conn(), &format!("ROLLBACK TO SAVEPOINT {name}"), &[]).await?;
        Ok(())
    }

    async fn settle(
        &mut self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError> {
        let (results, streams) =
            delivery::settle::<D>(self.conn(), token, now, batch, true).await?;
        self.promote_after_commit.extend(streams);
        Ok(results)
    }

    async fn renew_leases(&mut self, tokens: &[String], expires_at: i64) -> Result<(), StoreError> {
        if !D::SINGLE_WRITER || tokens.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(tokens).unwrap_or_else(|_| "[]".into());
        let sql = format!(
            "UPDATE event_leases SET expires_at = $1 WHERE expires_at < $1 AND token IN {}",
            D::json_text_array("$2")
        );
        execute::<D>(self.conn(), &sql, &[Arg::I64(expires_at), Arg::Str(&list)]).await?;
        Ok(())
    }

    async fn set_time_limit(&mut self, limit: Option<Duration>) -> Result<bool, StoreError> {
        let conn: &mut Conn<D> = self.tx.as_mut().expect("open transaction");
        D::set_time_limit(conn, &mut self.time_limit, limit)
            .await
            .map_err(db)
    }

    async fn complete(
        &mut self,
        token: &str,
        now: i64,
        settlement: &Settlement<'_>,
    ) -> Result<SettleResult, StoreError> {
        let done = delivery::complete_one::<D>(self.conn(), token, now, settlement).await?;
        if done && settlement.sequence > 0 {
            self.completed_runs.push((
                settlement.destination.to_owned(),
                settlement.aggregate_type.to_owned(),
                settlement.aggregate_id.to_owned(),
            ));
        }
        Ok(if done {
            SettleResult::Settled
        } else {
            SettleResult::LeaseLost
        })
    }

    fn native(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)> {
        if type_id != TypeId::of::<Conn<D>>() {
            return None;
        }
        let conn: &mut Conn<D> = &mut **self.tx.as_mut()?;
        Some(conn as &mut (dyn Any + Send))
    }

    async fn abandon(mut self: Box<Self>, kill_connection: bool) {
        if let Some(mut tx) = self.tx.take() {
            if kill_connection {
                D::kill(&mut tx).await;
            }
            drop(tx);
        }
    }
}
