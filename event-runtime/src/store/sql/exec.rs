//! Dynamic SQL over any sqlx driver: statements with `$N` placeholders bound from a list of
//! [`Arg`]s, and typed column reads. Knows no table and no dialect.
//!
//! The trait bounds a generic sqlx program needs (an executor for `&mut Connection`, `Encode` /
//! `Decode` / `Type` for every value type) are stated once, on the blanket impl of [`SqlExec`];
//! code generic over a driver asks only for `DB: SqlExec`.

use futures_util::future::BoxFuture;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

/// One value bound to a placeholder.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    I64(i64),
    OptI64(Option<i64>),
    Bool(bool),
    Str(&'a str),
    OptStr(Option<&'a str>),
}

/// A statement of driver `DB` with its arguments bound.
pub(crate) type SqlxQuery<'q, DB> = sqlx::query::Query<'q, DB, <DB as Database>::Arguments>;

/// Statements and typed reads on a connection of the driver `Self`.
pub(crate) trait SqlExec: Database {
    /// Runs `sql` with `args`; the driver's result (rows affected through the dialect).
    fn exec<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `sql` with `args` and collects every row.
    fn rows<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>>;

    /// Runs a query already bound (the portable API's); the driver's result.
    fn exec_query<'c>(
        conn: &'c mut Self::Connection,
        q: SqlxQuery<'c, Self>,
    ) -> BoxFuture<'c, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs a query already bound; every row, or only the first with `first_only`.
    fn fetch_query<'c>(
        conn: &'c mut Self::Connection,
        q: SqlxQuery<'c, Self>,
        first_only: bool,
    ) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>>;

    fn get_i64(row: &Self::Row, col: &str) -> Result<i64, sqlx::Error>;
    fn get_opt_i64(row: &Self::Row, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn get_string(row: &Self::Row, col: &str) -> Result<String, sqlx::Error>;
    fn get_opt_string(row: &Self::Row, col: &str) -> Result<Option<String>, sqlx::Error>;
}

fn query<'q, DB>(sql: &'q str, args: &[Arg<'_>]) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    DB: Database,
    i64: Type<DB> + for<'e> Encode<'e, DB>,
    Option<i64>: Type<DB> + for<'e> Encode<'e, DB>,
    bool: Type<DB> + for<'e> Encode<'e, DB>,
    for<'s> &'s str: Type<DB> + Encode<'s, DB>,
    for<'s> Option<&'s str>: Type<DB> + Encode<'s, DB>,
{
    // The SQL text is the runtime's own (never user input), built from constants and `$N`
    // placeholders only.
    let mut q = sqlx::query::<DB>(sqlx::AssertSqlSafe(sql));
    for a in args {
        q = match *a {
            Arg::I64(v) => q.bind(v),
            Arg::OptI64(v) => q.bind(v),
            Arg::Bool(v) => q.bind(v),
            Arg::Str(v) => q.bind(v),
            Arg::OptStr(v) => q.bind(v),
        };
    }
    q
}

impl<DB> SqlExec for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i64: Type<DB> + for<'e> Encode<'e, DB> + for<'r> Decode<'r, DB>,
    Option<i64>: Type<DB> + for<'e> Encode<'e, DB> + for<'r> Decode<'r, DB>,
    bool: Type<DB> + for<'e> Encode<'e, DB> + for<'r> Decode<'r, DB>,
    String: Type<DB> + for<'r> Decode<'r, DB>,
    Option<String>: Type<DB> + for<'r> Decode<'r, DB>,
    for<'s> &'s str: Type<DB> + Encode<'s, DB> + ColumnIndex<DB::Row>,
    for<'s> Option<&'s str>: Type<DB> + Encode<'s, DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn exec<'c>(
        conn: &'c mut DB::Connection,
        sql: &'c str,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<DB::QueryResult, sqlx::Error>> {
        let q = query::<DB>(sql, args);
        Box::pin(async move { q.execute(conn).await })
    }

    fn rows<'c>(
        conn: &'c mut DB::Connection,
        sql: &'c str,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<Vec<DB::Row>, sqlx::Error>> {
        let q = query::<DB>(sql, args);
        Box::pin(async move { q.fetch_all(conn).await })
    }

    fn exec_query<'c>(
        conn: &'c mut DB::Connection,
        q: SqlxQuery<'c, DB>,
    ) -> BoxFuture<'c, Result<DB::QueryResult, sqlx::Error>> {
        Box::pin(async move { q.execute(conn).await })
    }

    fn fetch_query<'c>(
        conn: &'c mut DB::Connection,
        q: SqlxQuery<'c, DB>,
        first_only: bool,
    ) -> BoxFuture<'c, Result<Vec<DB::Row>, sqlx::Error>> {
        Box::pin(async move {
            if first_only {
                Ok(q.fetch_optional(conn).await?.into_iter().collect())
            } else {
                q.fetch_all(conn).await
            }
        })
    }

    fn get_i64(row: &DB::Row, col: &str) -> Result<i64, sqlx::Error> {
        row.try_get(col)
    }
    fn get_opt_i64(row: &DB::Row, col: &str) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(col)
    }
    fn get_string(row: &DB::Row, col: &str) -> Result<String, sqlx::Error> {
        row.try_get(col)
    }
    fn get_opt_string(row: &DB::Row, col: &str) -> Result<Option<String>, sqlx::Error> {
        row.try_get(col)
    }
}

/// `$start, $start+1, …` for `n` values, as `($a, $b, …)` groups of `width`: the VALUES list
/// of a multi-row statement.
pub(crate) fn placeholders(rows: usize, width: usize, start: usize) -> String {
    let mut s = String::with_capacity(rows * width * 5);
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..width {
            if c > 0 {
                s.push_str(", ");
            }
            s.push('$');
            s.push_str(&(start + r * width + c).to_string());
        }
        s.push(')');
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_number_from_start() {
        assert_eq!(super::placeholders(2, 2, 3), "($3, $4), ($5, $6)");
        assert_eq!(super::placeholders(0, 2, 1), "");
    }
}
