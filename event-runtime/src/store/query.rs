//! The portable query API: [`Query`], built by [`Tx::query`] or [`Store::query`], binds
//! [`ToSql`] values and runs on whichever backend the store is; [`Row`] reads its columns by
//! name into [`FromSql`] types. Holds no SQL and names no database.

use std::fmt;
use std::sync::Arc;

use super::value::{Datum, FromSql, ToSql};
use super::{Store, StoreError, Tx};

/// One row of a portable query's result: its columns by name, read with [`get`](Self::get).
#[derive(Clone, PartialEq)]
pub struct Row {
    columns: Arc<[String]>,
    values: Vec<Datum>,
}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.columns.iter().zip(&self.values))
            .finish()
    }
}

impl Row {
    /// A row of `values` named by `columns`, which the rows of one result share (for
    /// [`BackendTransaction`](super::BackendTransaction) implementations).
    ///
    /// # Panics
    /// When the two lengths differ.
    pub fn new(columns: Arc<[String]>, values: Vec<Datum>) -> Row {
        assert_eq!(columns.len(), values.len(), "one value per column");
        Row { columns, values }
    }

    /// The value of column `column` as a `T`.
    ///
    /// The name is the one the database reports: write `AS name` for anything but a plain
    /// column (SQLite names `COUNT(*)` `COUNT(*)`, PostgreSQL `count`). An exact match wins;
    /// otherwise the match ignores ASCII case (PostgreSQL folds unquoted names to lower case,
    /// SQLite keeps them as written).
    ///
    /// # Errors
    /// [`StoreError::NoSuchColumn`]; [`StoreError::Decode`], naming the column and `T`, when
    /// the value is not a `T` (a `NULL` read as anything but an `Option`, an integer out of
    /// `T`'s range, a text that is no UUID…).
    pub fn get<T: FromSql>(&self, column: &str) -> Result<T, StoreError> {
        let index = self
            .columns
            .iter()
            .position(|c| c == column)
            .or_else(|| {
                self.columns
                    .iter()
                    .position(|c| c.eq_ignore_ascii_case(column))
            })
            .ok_or_else(|| StoreError::NoSuchColumn {
                column: column.to_owned(),
                columns: self.columns.join(", "),
            })?;
        self.get_at(index)
    }

    /// The value of the column at `index` (from 0) as a `T`.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    pub fn get_at<T: FromSql>(&self, index: usize) -> Result<T, StoreError> {
        let value = self
            .values
            .get(index)
            .ok_or_else(|| StoreError::NoSuchColumn {
                column: format!("#{index}"),
                columns: self.columns.join(", "),
            })?;
        T::from_datum(value).map_err(|found| StoreError::Decode {
            column: self.columns[index].clone(),
            expected: T::type_name().into_owned(),
            found,
        })
    }

    /// The column names, in order.
    pub fn columns(&self) -> impl ExactSizeIterator<Item = &str> {
        self.columns.iter().map(String::as_str)
    }

    /// The raw values, in column order.
    pub fn values(&self) -> &[Datum] {
        &self.values
    }

    /// How many columns.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the row has no column.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

enum On<'a> {
    Tx(&'a mut Tx),
    Store(&'a Store),
}

/// A statement with `$1`, `$2`, … placeholders and the values bound to them so far, made by
/// [`Tx::query`] (in the open transaction) or [`Store::query`] (on a pooled connection, outside
/// any unit of work). Bind one value per placeholder number, in order; a number may appear
/// several times in the SQL.
#[must_use = "a query does nothing until it is executed or fetched"]
pub struct Query<'a> {
    on: On<'a>,
    sql: &'static str,
    args: Vec<Datum>,
}

impl fmt::Debug for Query<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Query")
            .field("sql", &self.sql)
            .field("args", &self.args)
            .finish()
    }
}

impl<'a> Query<'a> {
    pub(crate) fn on_tx(tx: &'a mut Tx, sql: &'static str) -> Self {
        Query {
            on: On::Tx(tx),
            sql,
            args: Vec::new(),
        }
    }

    pub(crate) fn on_store(store: &'a Store, sql: &'static str) -> Self {
        Query {
            on: On::Store(store),
            sql,
            args: Vec::new(),
        }
    }

    /// Binds the next placeholder (`$1` first) to `value`.
    pub fn bind<T: ToSql>(mut self, value: T) -> Self {
        self.args.push(value.to_datum());
        self
    }

    /// Runs the statement; the number of rows it affected.
    ///
    /// # Errors
    /// [`StoreError::Database`]: the database refused the statement (on PostgreSQL the
    /// transaction is then aborted: only a rollback, or a rollback to a savepoint, is accepted
    /// until it ends).
    ///
    /// # Cancel safety
    /// In a transaction: dropping the future may leave the statement running in the database
    /// until it ends; the transaction stays open, roll it back. On a store: the statement
    /// commits or not on its own.
    pub async fn execute(self) -> Result<u64, StoreError> {
        match self.on {
            On::Tx(tx) => tx.backend().execute(self.sql, &self.args).await,
            On::Store(store) => store.backend().execute(self.sql, &self.args).await,
        }
    }

    /// Runs the query; every row.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    ///
    /// # Cancel safety
    /// As [`execute`](Self::execute).
    pub async fn fetch_all(self) -> Result<Vec<Row>, StoreError> {
        self.fetch(false).await
    }

    /// Runs the query; its first row, if there is one (the others are not read).
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    ///
    /// # Cancel safety
    /// As [`execute`](Self::execute).
    pub async fn fetch_optional(self) -> Result<Option<Row>, StoreError> {
        Ok(self.fetch(true).await?.into_iter().next())
    }

    /// Runs the query; its first row.
    ///
    /// # Errors
    /// [`StoreError::NoRow`] when there is none; otherwise as [`execute`](Self::execute).
    ///
    /// # Cancel safety
    /// As [`execute`](Self::execute).
    pub async fn fetch_one(self) -> Result<Row, StoreError> {
        self.fetch_optional().await?.ok_or(StoreError::NoRow)
    }

    async fn fetch(self, first_only: bool) -> Result<Vec<Row>, StoreError> {
        match self.on {
            On::Tx(tx) => tx.backend().fetch(self.sql, &self.args, first_only).await,
            On::Store(store) => {
                store
                    .backend()
                    .fetch(self.sql, &self.args, first_only)
                    .await
            }
        }
    }
}
