//! The application's portable SQL ([`Tx::query`](crate::Tx::query),
//! [`Store::query`](crate::Store::query)) on a dialect's connection: values bound the way the
//! dialect stores them, rows read into data. Decides nothing about the outbox's own tables.

use std::sync::Arc;

use sqlx::{Column, Row as _};

use super::exec::{SqlExec, SqlxQuery};
use super::{db, Conn, Dialect};
use crate::store::query::Row;
use crate::store::value::Datum;
use crate::store::StoreError;

fn portable_query<'q, D: Dialect>(sql: &'q str, args: &[Datum]) -> SqlxQuery<'q, D::DB> {
    // The application's SQL text: values go through `bind`, never into the text.
    let mut q = sqlx::query::<D::DB>(sqlx::AssertSqlSafe(sql));
    for a in args {
        q = D::bind(q, a);
    }
    q
}

/// Runs a portable statement on `conn`; rows affected.
pub(super) async fn portable_execute<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Datum],
) -> Result<u64, StoreError> {
    let q = portable_query::<D>(sql, args);
    let r = D::DB::exec_query(conn, q).await.map_err(db)?;
    Ok(D::rows_affected(&r))
}

/// Runs a portable query on `conn`; its rows as data.
pub(super) async fn portable_fetch<D: Dialect>(
    conn: &mut Conn<D>,
    sql: &str,
    args: &[Datum],
    first_only: bool,
) -> Result<Vec<Row>, StoreError> {
    let q = portable_query::<D>(sql, args);
    let rows = D::DB::fetch_query(conn, q, first_only).await.map_err(db)?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns: Arc<[String]> = first
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    Ok(rows
        .iter()
        .map(|r| {
            let values = (0..columns.len()).map(|i| D::datum(r, i)).collect();
            Row::new(columns.clone(), values)
        })
        .collect())
}
