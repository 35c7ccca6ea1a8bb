//! [`Tx`], the open transaction handlers and units of work write through, on whichever
//! backend the store is; and [`SqlValue`], what its statements bind. Holds no SQL of its own.

use std::any::{Any, TypeId};
use std::fmt;

use super::backend::BackendTransaction;
use super::query::Query;
use super::value::{Datum, SqlType};
use super::StoreError;
use crate::dispatch::dispatcher::TransactionSource;

/// An open transaction of the store: the application's writes, the outbox rows and the
/// delivery rows of one unit of work go through it, and so do a delivery's handler writes and
/// its completion record.
///
/// A handler that takes `&mut Tx` works on every backend; one that takes the backend's
/// native connection (`&mut sqlx::SqliteConnection`, `&mut sqlx::PgConnection`) gets the
/// connection of the open transaction directly, and runs only on that backend (start-up says
/// so otherwise). [`native`](Self::native) reaches it from a `Tx`.
///
/// Statements use `$1`, `$2`, … placeholders on every backend (SQLite accepts them too).
///
/// Dropping a `Tx` without [`commit`](Self::commit) rolls it back.
pub struct Tx {
    inner: Box<dyn BackendTransaction>,
}

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Tx {
    /// Wraps a backend's transaction (for [`Backend`](super::Backend) implementations).
    pub fn from_backend(inner: Box<dyn BackendTransaction>) -> Self {
        Tx { inner }
    }

    pub(crate) fn backend(&mut self) -> &mut dyn BackendTransaction {
        &mut *self.inner
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn into_backend(self) -> Box<dyn BackendTransaction> {
        self.inner
    }

    /// Commits.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the database refused the commit (connection lost,
    /// serialization failure); nothing of the transaction was kept.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped while the COMMIT is in flight, the transaction may or may not
    /// have committed.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.inner.commit().await
    }

    /// Rolls back.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the connection was lost (the server rolls back by itself
    /// then).
    ///
    /// # Cancel safety
    /// Cancel safe: a transaction that is dropped is rolled back.
    pub async fn rollback(self) -> Result<(), StoreError> {
        self.inner.rollback().await
    }

    /// A portable statement in this transaction: bind its `$N` values with
    /// [`Query::bind`], then [`execute`](Query::execute) it or fetch its rows
    /// ([`fetch_one`](Query::fetch_one), [`fetch_optional`](Query::fetch_optional),
    /// [`fetch_all`](Query::fetch_all)) and read their columns by name with
    /// [`Row::get`](super::Row::get). The same code runs on every store; see the
    /// [module docs](crate::store#portable-sql) for the types, how each store keeps them and
    /// what SQL is not portable.
    ///
    /// # Examples
    ///
    /// ```
    /// use event_runtime::Store;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("query-doc-{}.db", uuid::Uuid::now_v7()));
    /// # let url = format!("sqlite://{}", path.display());
    /// let store = Store::connect(&url).await?;
    /// let mut tx = store.begin().await?;
    /// tx.query("CREATE TABLE parcels (id TEXT PRIMARY KEY, grams INTEGER NOT NULL, note TEXT)")
    ///     .execute()
    ///     .await?;
    /// let inserted = tx
    ///     .query("INSERT INTO parcels (id, grams, note) VALUES ($1, $2, $3)")
    ///     .bind("p-1")
    ///     .bind(1200_i32)
    ///     .bind(None::<String>)
    ///     .execute()
    ///     .await?;
    /// assert_eq!(inserted, 1);
    ///
    /// let row = tx
    ///     .query("SELECT grams, note FROM parcels WHERE id = $1")
    ///     .bind("p-1")
    ///     .fetch_one()
    ///     .await?;
    /// assert_eq!(row.get::<i32>("grams")?, 1200);
    /// assert_eq!(row.get::<Option<String>>("note")?, None);
    /// tx.commit().await?;
    /// # drop(store); std::fs::remove_file(path).ok();
    /// # Ok(())
    /// # }
    /// ```
    pub fn query(&mut self, sql: &'static str) -> Query<'_> {
        Query::on_tx(self, sql)
    }

    /// Runs one statement with `$N` placeholders bound to `args`. Returns the number of rows
    /// affected. The short form of [`query`](Self::query) for integers and text.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the database refused the statement (on PostgreSQL the
    /// transaction is then aborted: only a rollback, or a rollback to a savepoint, is
    /// accepted until it ends).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the statement running in the database until it ends;
    /// the transaction stays open. Roll it back.
    pub async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, StoreError> {
        let args: Vec<Datum> = args.iter().map(SqlValue::datum).collect();
        self.inner.execute(sql, &args).await
    }

    /// Runs one query with `$N` placeholders and returns the first column of the first row
    /// as an integer, if there is a row (`SELECT count(*) …`, `SELECT amount …`). On
    /// PostgreSQL `SUM` of a `BIGINT` is `NUMERIC`: write `CAST(SUM(x) AS BIGINT)`.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the database refused the query; [`StoreError::Decode`]: the
    /// column is not an integer (or is `NULL`).
    ///
    /// # Cancel safety
    /// As [`execute`](Self::execute).
    pub async fn fetch_i64(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<Option<i64>, StoreError> {
        let args: Vec<Datum> = args.iter().map(SqlValue::datum).collect();
        match self.inner.fetch(sql, &args, true).await?.first() {
            Some(row) => row.get_at(0).map(Some),
            None => Ok(None),
        }
    }

    /// The backend's native connection of this transaction, when it is a `T`
    /// (`sqlx::SqliteConnection` on SQLite, `sqlx::PgConnection` on PostgreSQL): for SQL the
    /// portable API cannot express.
    pub fn native<T: Any + Send>(&mut self) -> Option<&mut T> {
        self.inner
            .native(TypeId::of::<T>())
            .and_then(|c| c.downcast_mut::<T>())
    }
}

impl SqlValue<'_> {
    pub(crate) fn datum(&self) -> Datum {
        match *self {
            SqlValue::Int(v) => Datum::Int(v),
            SqlValue::Text(v) => Datum::Text(v.to_owned()),
            SqlValue::Null => Datum::Null(SqlType::Int),
        }
    }
}

/// A value bound to a `$N` placeholder by [`Tx::execute`] and [`Tx::fetch_i64`], the short
/// form for integers and text; [`Tx::query`] binds every portable type.
#[derive(Debug, Clone, Copy)]
pub enum SqlValue<'a> {
    /// A 64-bit integer (`BIGINT` / `INTEGER`).
    Int(i64),
    /// Text.
    Text(&'a str),
    /// SQL NULL.
    Null,
}

impl TransactionSource for Tx {
    fn param(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)> {
        if type_id == TypeId::of::<Tx>() {
            return Some(self);
        }
        self.inner.native(type_id)
    }
}
