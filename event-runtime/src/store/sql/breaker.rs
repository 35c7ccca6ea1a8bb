//! The probe of a circuit breaker's pause, as statements any SQL dialect runs: take the probe
//! (one worker store-wide), then lease the destination's oldest ready head, or lift the pause
//! when there is none.

use sqlx::Pool;

use super::claim::{claimed_from_row, CLAIMED_COLUMNS};
use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::{ProbeClaim, ProbeRequest};
use crate::store::StoreError;
use crate::store::BREAKER;

pub(crate) async fn claim_probe<D: Dialect>(
    pool: &Pool<D::DB>,
    req: &ProbeRequest<'_>,
) -> Result<ProbeClaim, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    let conn: &mut Conn<D> = &mut tx;
    // An operator's (or a runtime's) pause in force holds the probe back.
    let other = rows::<D>(
        conn,
        "SELECT 1 AS one FROM event_paused_destinations WHERE destination = $1 AND paused_by <> $2 \
         AND (expires_at IS NULL OR expires_at > $3)",
        &[Arg::Str(req.destination), Arg::Str(BREAKER), Arg::I64(req.now)],
    )
    .await?;
    if !other.is_empty() {
        tx.rollback().await.map_err(db)?;
        return Ok(ProbeClaim::NotDue);
    }
    // One worker store-wide: the row's lock (PostgreSQL) or the write lock (SQLite) orders
    // concurrent takers, and the second finds probe_at moved.
    let taken = execute::<D>(
        conn,
        "UPDATE event_paused_destinations SET probe_token = $1, probe_at = $2 \
         WHERE destination = $3 AND paused_by = $4 AND probe_at IS NOT NULL AND probe_at <= $5",
        &[
            Arg::Str(req.token),
            Arg::I64(req.probe_until),
            Arg::Str(req.destination),
            Arg::Str(BREAKER),
            Arg::I64(req.now),
        ],
    )
    .await?;
    if taken == 0 {
        tx.rollback().await.map_err(db)?;
        return Ok(ProbeClaim::NotDue);
    }
    // The oldest ready head not leased under a live lease, due or not: the retry schedule is
    // the event's, the probe is the destination's.
    let head = rows::<D>(
        conn,
        &format!(
            "SELECT d.event_id FROM {} \
             WHERE d.status = 'pending' AND d.ready AND NOT d.held AND d.handler = $1 \
               AND (d.lease_token IS NULL OR NOT EXISTS (SELECT 1 FROM event_leases l \
                   WHERE l.token = d.lease_token AND l.expires_at >= $2)) \
               AND (d.sequence = 0 OR NOT EXISTS (SELECT 1 FROM event_deliveries p \
                   WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type \
                     AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence \
                     AND p.status IN ('pending', 'dead'))) \
             ORDER BY d.next_attempt_at LIMIT 1",
            D::HEADS_TABLE
        ),
        &[Arg::Str(req.destination), Arg::I64(req.now)],
    )
    .await?;
    let Some(head) = head.first() else {
        super::delivery::resume_on::<D>(conn, req.destination, BREAKER).await?;
        tx.commit().await.map_err(db)?;
        return Ok(ProbeClaim::Nothing);
    };
    let event_id = D::DB::get_string(head, "event_id").map_err(db)?;
    super::delivery::upsert_lease::<D>(
        conn,
        &crate::store::backend::ClaimRequest {
            token: req.token,
            owner: req.owner,
            lease_expires_at: req.lease_expires_at,
            destinations: &[],
            max_runs: 1,
            max_deliveries: 1,
            now: req.now,
        },
    )
    .await?;
    // As a claimed head: one attempt counted if a dead lease held it (its worker probably
    // died delivering it).
    execute::<D>(
        conn,
        "UPDATE event_deliveries SET \
             attempts = attempts + CASE WHEN lease_token IS NULL THEN 0 ELSE 1 END, \
             lease_token = $1 WHERE handler = $2 AND event_id = $3",
        &[
            Arg::Str(req.token),
            Arg::Str(req.destination),
            Arg::Str(&event_id),
        ],
    )
    .await?;
    let claimed = rows::<D>(
        conn,
        &format!(
            "SELECT {CLAIMED_COLUMNS} FROM event_deliveries d JOIN event_outbox o ON o.event_id = d.event_id \
             WHERE d.handler = $1 AND d.event_id = $2"
        ),
        &[Arg::Str(req.destination), Arg::Str(&event_id)],
    )
    .await?;
    let Some(row) = claimed.first() else {
        tx.rollback().await.map_err(db)?;
        return Err(StoreError::Corrupt(format!(
            "the delivery {event_id} of `{}` has no outbox row",
            req.destination
        )));
    };
    let delivery = claimed_from_row::<D>(row)?;
    tx.commit().await.map_err(db)?;
    Ok(ProbeClaim::Claimed(delivery))
}
