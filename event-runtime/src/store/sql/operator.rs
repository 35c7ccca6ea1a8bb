//! What an operator's tool asks of the SQL store beyond listing and resolving: dead letters
//! matching a filter and open / resolved ones per (handler, event name), the events a
//! destination added late never got, and pauses of a destination recorded with their audit
//! row.

use crate::store::backend::AuditStamp;
use sqlx::Pool;

use super::audit::{self, NewAudit};
use super::delivery::{pause_on, resume_on};
use super::exec::{Arg, SqlExec};
use super::{db, rows, Dialect};
use crate::store::backend::Pause;
use crate::store::types::{AuditEntry, DeadLetterCount, DeadLetterFilter};
use crate::store::{StoreError, OPERATOR};

/// How many dead letters match `filter`, ignoring its `limit`: the `WHERE` of
/// `dead_letters::list`, counted.
pub(crate) async fn count_dead_letters<D: Dialect>(
    pool: &Pool<D::DB>,
    filter: &DeadLetterFilter,
) -> Result<u64, StoreError> {
    const SQL: &str = concat!(
        "SELECT COUNT(*) AS n FROM event_dead_letters ",
        super::dead_letters::dead_letter_filter!()
    );
    let mut conn = pool.acquire().await.map_err(db)?;
    super::count::<D>(&mut conn, SQL, &super::dead_letters::filter_args(filter)).await
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

/// `None` when `destination` has a delivery row; otherwise how many events named in `names`
/// were recorded at or after `since`, counted up to `cap`.
pub(crate) async fn unrouted_events<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
    names: &[&str],
    since: i64,
    cap: u64,
) -> Result<Option<u64>, StoreError> {
    const ROUTED: &str = "SELECT 1 AS one FROM event_deliveries WHERE handler = $1 LIMIT 1";
    let mut conn = pool.acquire().await.map_err(db)?;
    if !rows::<D>(&mut conn, ROUTED, &[Arg::Str(destination)])
        .await?
        .is_empty()
    {
        return Ok(None);
    }
    if names.is_empty() {
        return Ok(Some(0));
    }
    let list: Vec<String> = (0..names.len()).map(|i| format!("${}", i + 3)).collect();
    let sql = format!(
        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM event_outbox \
         WHERE recorded_at >= $1 AND name IN ({}) LIMIT $2) AS e",
        list.join(", ")
    );
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    let mut args = vec![Arg::I64(since), Arg::I64(cap)];
    args.extend(names.iter().map(|n| Arg::Str(n)));
    Ok(Some(super::count::<D>(&mut conn, &sql, &args).await?))
}

/// The operator's pause of `destination` (no expiry) and its audit row, in one transaction.
pub(crate) async fn pause_audited<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
    stamp: &AuditStamp<'_>,
) -> Result<AuditEntry, StoreError> {
    let pause = Pause {
        destination: destination.to_owned(),
        paused_by: OPERATOR.to_owned(),
        reason: stamp.reason.to_owned(),
        at: stamp.at,
        expires_at: None,
        probe_at: None,
    };
    let mut tx = D::begin(pool).await.map_err(db)?;
    pause_on::<D>(&mut tx, &pause).await?;
    let entry = audited::<D>(&mut tx, "pause", destination, stamp).await?;
    tx.commit().await.map_err(db)?;
    Ok(entry)
}

/// Lifts the operator's and the circuit breaker's pauses of `destination`, with an audit row,
/// in one transaction; `None` (nothing written) when neither had paused it.
pub(crate) async fn resume_audited<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
    stamp: &AuditStamp<'_>,
) -> Result<Option<AuditEntry>, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    let operator = resume_on::<D>(&mut tx, destination, OPERATOR).await?;
    let breaker = resume_on::<D>(&mut tx, destination, crate::store::BREAKER).await?;
    if !operator && !breaker {
        tx.rollback().await.map_err(db)?;
        return Ok(None);
    }
    let entry = audited::<D>(&mut tx, "resume", destination, stamp).await?;
    tx.commit().await.map_err(db)?;
    Ok(Some(entry))
}

/// The audit row of a pause or resume: reason `DESTINATION: REASON`, no dead letters.
async fn audited<D: Dialect>(
    conn: &mut super::Conn<D>,
    action: &str,
    destination: &str,
    stamp: &AuditStamp<'_>,
) -> Result<AuditEntry, StoreError> {
    let reason = format!("{destination}: {}", stamp.reason);
    let stamp = AuditStamp {
        reason: &reason,
        ..*stamp
    };
    audit::insert::<D>(conn, &NewAudit::finished(action, stamp)).await
}
