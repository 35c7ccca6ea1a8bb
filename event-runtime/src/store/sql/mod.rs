//! The outbox over an sqlx driver, shared by the SQL backends: [`SqlStore`] implements
//! [`Backend`](crate::store::Backend) (`store.rs`) and [`SqlTx`] implements
//! [`BackendTransaction`](crate::store::BackendTransaction) (`tx.rs`) once, generically, with
//! the statements every supported dialect accepts, one module per job (`append`, `claim`,
//! `delivery`, `dead_letters`, `inbox`, `audit`, …); what differs (connecting, claiming, time
//! limits, error codes) comes from the backend's [`Dialect`] (`dialect.rs`). Names no database
//! itself.

pub(crate) mod append;
pub(crate) mod audit;
pub(crate) mod breaker;
pub(crate) mod catalog;
pub(crate) mod chain;
pub(crate) mod claim;
pub(crate) mod dead_letters;
pub(crate) mod delivery;
mod dialect;
pub(crate) mod exec;
pub(crate) mod gaps;
pub(crate) mod group;
pub(crate) mod inbox;
pub(crate) mod maintenance;
pub(crate) mod operator;
mod portable;
pub(crate) mod republish;
pub(crate) mod resolution;
pub(crate) mod retarget;
mod store;
mod tx;

use std::fmt;

use sqlx::{Database, Pool};

use self::exec::{Arg, SqlExec};
use super::{DatabaseError, StoreError};

/// The connection type of a dialect's driver.
pub(crate) type Conn<D> = <<D as Dialect>::DB as Database>::Connection;

/// The table the outbox records its own migrations in, apart from the application's
/// `_sqlx_migrations`.
pub(crate) const MIGRATIONS_TABLE: &str = "_event_outbox_migrations";

pub(crate) use dialect::Dialect;
pub(crate) use tx::SqlTx;

/// An outbox store over one sqlx pool of dialect `D`.
pub(crate) struct SqlStore<D: Dialect> {
    pub(crate) pool: Pool<D::DB>,
}

impl<D: Dialect> SqlStore<D> {
    /// A [`Store`](crate::Store) over `pool`: what each SQL backend module's
    /// `store_from_pool` returns.
    pub(crate) fn store(pool: Pool<D::DB>) -> crate::Store {
        crate::Store::from_backend(std::sync::Arc::new(SqlStore::<D>::new(pool)))
    }

    /// The pool under `store` when it is this dialect's.
    pub(crate) fn pool_of(store: &crate::Store) -> Option<&Pool<D::DB>> {
        store
            .backend()
            .as_any()
            .downcast_ref::<SqlStore<D>>()
            .map(|s| &s.pool)
    }
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
        StoreError::Migrate(DatabaseError::from(e))
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

/// Commits `tx`, then promotes the heads of the runs `streams` again where the dialect needs
/// it ([`Dialect::PROMOTE_AFTER_COMMIT`]): the tail of every transaction that unblocks runs.
pub(crate) async fn commit_and_promote<D: Dialect>(
    tx: sqlx::Transaction<'static, D::DB>,
    pool: &Pool<D::DB>,
    streams: &[append::StreamKey],
) -> Result<(), StoreError> {
    tx.commit().await.map_err(db)?;
    if D::PROMOTE_AFTER_COMMIT && !streams.is_empty() {
        promote_after_commit::<D>(pool, streams).await?;
    }
    Ok(())
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

/// Runs `sql` (a `SELECT COUNT(*) AS n …`, or any one-row query naming its number `n`) on
/// `conn`: that number, 0 when there is no row, never negative.
pub(crate) async fn count<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<u64, StoreError> {
    let n = rows::<D>(conn, sql, args)
        .await?
        .first()
        .map(|r| D::DB::get_i64(r, "n"))
        .transpose()
        .map_err(db)?
        .unwrap_or(0);
    Ok(n.max(0) as u64)
}

/// Runs `sql` on `conn`; every row.
pub(crate) async fn rows<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<Vec<<D::DB as Database>::Row>, StoreError> {
    D::DB::rows(conn, sql, args).await.map_err(db)
}
