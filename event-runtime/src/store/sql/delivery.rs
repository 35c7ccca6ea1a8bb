//! The delivery side of the SQL store: worker leases, settling outcomes (fenced by the lease
//! token, one result per row: `delivery/settlement.rs`), run repair, the progress count and
//! destination pauses. The claim itself is the dialect's; running handlers is the engine's.

mod settlement;

use sqlx::Pool;

use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::Pause;
use crate::store::types::PausedDestination;
use crate::store::{from_ms, StoreError};

pub(crate) use settlement::{complete_one, settle};

/// Writes the lease row of a claim, or extends it, inside the claim's transaction.
pub(crate) async fn upsert_lease<D: Dialect>(
    conn: &mut Conn<D>,
    req: &crate::store::backend::ClaimRequest<'_>,
) -> Result<(), StoreError> {
    execute::<D>(
        conn,
        "INSERT INTO event_leases (token, owner, acquired_at, expires_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (token) DO UPDATE SET expires_at = excluded.expires_at \
         WHERE event_leases.expires_at < excluded.expires_at",
        &[
            Arg::Str(req.token),
            Arg::Str(req.owner),
            Arg::I64(req.now),
            Arg::I64(req.lease_expires_at),
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn renew_lease<D: Dialect>(
    pool: &Pool<D::DB>,
    token: &str,
    expires_at: i64,
) -> Result<bool, StoreError> {
    let mut tx = super::begin_relaxed::<D>(pool).await?;
    let n = execute::<D>(
        &mut tx,
        // Never backwards: a renewal that waited for the write lock (SQLite) carries an expiry
        // computed before the wait, older than one the lock holder wrote meanwhile.
        "UPDATE event_leases SET expires_at = $2 WHERE token = $1 AND expires_at < $2",
        &[Arg::Str(token), Arg::I64(expires_at)],
    )
    .await?;
    tx.commit().await.map_err(db)?;
    Ok(n == 1)
}

pub(crate) async fn drop_lease<D: Dialect>(
    pool: &Pool<D::DB>,
    token: &str,
) -> Result<u64, StoreError> {
    let mut tx = super::begin_relaxed::<D>(pool).await?;
    let n = execute::<D>(
        &mut tx,
        "UPDATE event_deliveries SET lease_token = NULL WHERE lease_token = $1 AND status IN ('pending', 'dead')",
        &[Arg::Str(token)],
    )
    .await?;
    execute::<D>(
        &mut tx,
        "DELETE FROM event_leases WHERE token = $1",
        &[Arg::Str(token)],
    )
    .await?;
    tx.commit().await.map_err(db)?;
    Ok(n)
}

pub(crate) async fn repair_runs<D: Dialect>(
    pool: &Pool<D::DB>,
    expired_before: i64,
) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    // Every run with a delivery waiting has its head (the lowest pending or dead delivery)
    // made ready unless it is already: one pass over the waiting deliveries to find the runs,
    // one key lookup per run (never a comparison of each waiting delivery with the others).
    let n = execute::<D>(
        &mut conn,
        "UPDATE event_deliveries SET ready = TRUE \
         FROM (SELECT w.handler AS h, (SELECT p.event_id FROM event_deliveries p \
                 WHERE p.handler = w.handler AND p.aggregate_type = w.aggregate_type \
                   AND p.aggregate_id = w.aggregate_id AND p.status IN ('pending', 'dead') \
                   AND p.sequence > 0 ORDER BY p.sequence LIMIT 1) AS e \
               FROM (SELECT DISTINCT handler, aggregate_type, aggregate_id FROM event_deliveries \
                     WHERE status IN ('pending', 'dead') AND status = 'pending' AND NOT ready \
                       AND sequence > 0) AS w) AS n \
         WHERE event_deliveries.handler = n.h AND event_deliveries.event_id = n.e \
           AND event_deliveries.status = 'pending' AND NOT event_deliveries.ready \
           AND NOT event_deliveries.held",
        &[],
    )
    .await?;
    execute::<D>(
        &mut conn,
        "DELETE FROM event_leases WHERE expires_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM event_deliveries d \
             WHERE d.status IN ('pending', 'dead') AND d.lease_token = event_leases.token)",
        &[Arg::I64(expired_before)],
    )
    .await?;
    Ok(n)
}

/// Runs that can still progress: pending heads (ready, due now or later) of `destinations`
/// that are not paused. A run whose head is dead waits for its replay or purge and does not
/// count; a delivery behind a head is part of that head's run. Answered from the ready-head
/// index: its cost follows the heads, not the backlog behind them.
pub(crate) async fn progressing<D: Dialect>(
    pool: &Pool<D::DB>,
    destinations: &[String],
) -> Result<u64, StoreError> {
    let list = serde_json::to_string(destinations).unwrap_or_else(|_| "[]".into());
    let sql = format!(
        "SELECT COUNT(*) AS n FROM {} \
         WHERE d.status = 'pending' AND d.ready AND d.handler IN {} \
         AND NOT EXISTS (SELECT 1 FROM event_paused_destinations z WHERE z.destination = d.handler \
             AND z.paused_by <> 'breaker')",
        D::HEADS_TABLE,
        D::json_text_array("$1")
    );
    let mut conn = pool.acquire().await.map_err(db)?;
    super::count::<D>(&mut conn, &sql, &[Arg::Str(&list)]).await
}

pub(crate) async fn pause<D: Dialect>(pool: &Pool<D::DB>, p: &Pause) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    pause_on::<D>(&mut conn, p).await
}

/// [`pause`] on `conn` (the caller's transaction, for an audited pause).
pub(crate) async fn pause_on<D: Dialect>(conn: &mut Conn<D>, p: &Pause) -> Result<(), StoreError> {
    execute::<D>(
        conn,
        "INSERT INTO event_paused_destinations (destination, paused_by, reason, paused_at, expires_at, probe_at) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (destination, paused_by) DO UPDATE SET reason = excluded.reason, \
             expires_at = excluded.expires_at, probe_at = excluded.probe_at, probe_token = NULL",
        &[
            Arg::Str(&p.destination),
            Arg::Str(&p.paused_by),
            Arg::Str(&p.reason),
            Arg::I64(p.at),
            Arg::OptI64(p.expires_at),
            Arg::OptI64(p.probe_at),
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn resume<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
    paused_by: &str,
) -> Result<bool, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    resume_on::<D>(&mut conn, destination, paused_by).await
}

/// [`resume`] on `conn` (the caller's transaction, for an audited resume).
pub(crate) async fn resume_on<D: Dialect>(
    conn: &mut Conn<D>,
    destination: &str,
    paused_by: &str,
) -> Result<bool, StoreError> {
    let n = execute::<D>(
        conn,
        "DELETE FROM event_paused_destinations WHERE destination = $1 AND paused_by = $2",
        &[Arg::Str(destination), Arg::Str(paused_by)],
    )
    .await?;
    Ok(n > 0)
}

pub(crate) async fn paused<D: Dialect>(
    pool: &Pool<D::DB>,
    now: i64,
) -> Result<Vec<PausedDestination>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(
        &mut conn,
        "SELECT destination, paused_by, reason, paused_at, expires_at, probe_at FROM event_paused_destinations \
         WHERE expires_at IS NULL OR expires_at > $1 ORDER BY destination, paused_by",
        &[Arg::I64(now)],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(PausedDestination {
            destination: D::DB::get_string(r, "destination").map_err(db)?,
            paused_by: D::DB::get_string(r, "paused_by").map_err(db)?,
            reason: D::DB::get_string(r, "reason").map_err(db)?,
            paused_at: from_ms(D::DB::get_i64(r, "paused_at").map_err(db)?),
            expires_at: D::DB::get_opt_i64(r, "expires_at").map_err(db)?.map(from_ms),
            probe_at: D::DB::get_opt_i64(r, "probe_at").map_err(db)?.map(from_ms),
        })
    })
    .collect()
}
