//! What one SQL database does its own way: the [`Dialect`] each SQL backend module
//! implements (connecting, claiming, time limits, error codes, migrations, binding).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::{Database, Pool};

use super::exec::{SqlExec, SqlxQuery};
use super::Conn;
use crate::store::backend::{ClaimRequest, ClaimedDelivery};
use crate::store::value::Datum;
use crate::store::StoreError;

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

    /// A query with a row when sqlx's default migrations table `_sqlx_migrations` exists in
    /// the schema the connections see first (where release 0.1.0 recorded the outbox's).
    const OLD_MIGRATIONS_TABLE: &'static str;

    /// The columns of [`MIGRATIONS_TABLE`] (sqlx's), in this database's types, as
    /// `CREATE TABLE` takes them: `(version BIGINT PRIMARY KEY, …)`.
    const MIGRATIONS_COLUMNS: &'static str;

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
    #[cfg(feature = "fault-injection")]
    fn kill(conn: &mut Conn<Self>) -> impl Future<Output = ()> + Send;

    /// Binds the next placeholder of `q` to `value`, stored the way this database keeps that
    /// type (the portable API: what one dialect writes, every other reads back equal).
    fn bind<'q>(q: SqlxQuery<'q, Self::DB>, value: &Datum) -> SqlxQuery<'q, Self::DB>;

    /// Column `index` of `row` as the datum it holds.
    fn datum(row: &<Self::DB as Database>::Row, index: usize) -> Datum;
}
