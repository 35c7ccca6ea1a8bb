//! Counting queries of the SQL store that the `events` tool needs: dead letters matching a
//! filter, and open / resolved dead letters per (handler, event name). Reads only.

use sqlx::Pool;

use super::exec::{Arg, SqlExec};
use super::{db, rows, Dialect};
use crate::store::types::{DeadLetterCount, DeadLetterFilter};
use crate::store::StoreError;

/// How many dead letters match `filter`, ignoring its `limit`: the `WHERE` of
/// `dead_letters::list`, counted.
pub(crate) async fn count_dead_letters<D: Dialect>(
    pool: &Pool<D::DB>,
    filter: &DeadLetterFilter,
) -> Result<u64, StoreError> {
    const SQL: &str = "SELECT COUNT(*) AS n FROM event_dead_letters
        WHERE ($1 OR resolved_at IS NULL)
          AND ($2 IS NULL OR handler = $2)
          AND ($3 IS NULL OR name = $3)
          AND ($4 IS NULL OR dead_at >= $4)
          AND ($5 IS NULL OR dead_at < $5)
          AND ($6 IS NULL OR id = $6)";
    let mut conn = pool.acquire().await.map_err(db)?;
    let r = rows::<D>(
        &mut conn,
        SQL,
        &[
            Arg::Bool(filter.include_resolved),
            Arg::OptStr(filter.handler.as_deref()),
            Arg::OptStr(filter.event_name.as_deref()),
            Arg::OptI64(filter.since.map(|t| t.timestamp_millis())),
            Arg::OptI64(filter.until.map(|t| t.timestamp_millis())),
            Arg::OptI64(filter.id),
        ],
    )
    .await?;
    let n = r
        .first()
        .map(|r| D::DB::get_i64(r, "n"))
        .transpose()
        .map_err(db)?
        .unwrap_or(0);
    Ok(n.max(0) as u64)
}

/// Open and resolved dead letters per (handler, event name), ordered by both.
pub(crate) async fn dead_letter_counts<D: Dialect>(
    pool: &Pool<D::DB>,
) -> Result<Vec<DeadLetterCount>, StoreError> {
    const SQL: &str = "SELECT handler, name,
            CAST(SUM(CASE WHEN resolved_at IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS open,
            COUNT(*) AS n
        FROM event_dead_letters GROUP BY handler, name ORDER BY handler, name";
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(&mut conn, SQL, &[])
        .await?
        .iter()
        .map(|r| {
            let open = D::DB::get_i64(r, "open").map_err(db)?.max(0) as u64;
            let all = D::DB::get_i64(r, "n").map_err(db)?.max(0) as u64;
            Ok(DeadLetterCount {
                handler: D::DB::get_string(r, "handler").map_err(db)?,
                event_name: D::DB::get_string(r, "name").map_err(db)?,
                open,
                resolved: all.saturating_sub(open),
            })
        })
        .collect()
}
