//! The delivery side of the SQL store: worker leases, settling outcomes (fenced by the lease
//! token, one result per row), run repair, the progress count and destination pauses. The
//! claim itself is the dialect's; running handlers is the engine's.

use std::collections::HashSet;

use sqlx::Pool;

use super::append::{promote, StreamKey};
use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::{Pause, SettleOutcome, SettleResult, Settlement};
use crate::store::types::PausedDestination;
use crate::store::{from_ms, StoreError};

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

const SAVEPOINT: &str = "event_settle";

/// Runs `step` on `conn`; when `contained`, inside its own savepoint, undone alone if it
/// fails.
async fn contained<D: Dialect, T>(
    conn: &mut Conn<D>,
    contained: bool,
    step: impl AsyncFnOnce(&mut Conn<D>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    if !contained {
        return step(conn).await;
    }
    execute::<D>(conn, &format!("SAVEPOINT {SAVEPOINT}"), &[]).await?;
    match step(conn).await {
        Ok(v) => {
            execute::<D>(conn, &format!("RELEASE SAVEPOINT {SAVEPOINT}"), &[]).await?;
            Ok(v)
        }
        Err(e) => {
            execute::<D>(conn, &format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"), &[]).await?;
            execute::<D>(conn, &format!("RELEASE SAVEPOINT {SAVEPOINT}"), &[]).await?;
            Err(e)
        }
    }
}

/// Records `batch` on `conn` (inside the caller's transaction), fenced by `token`.
///
/// A row is found by its primary key and fenced by `lease_token = $token` alone: only a
/// pending delivery ever holds a token (every other status clears it), and a condition on
/// `status` would let a planner with stale statistics pick a partial index of pending rows
/// and read the whole backlog (seen on PostgreSQL after a burst).
///
/// Completions and releases are one statement each; retries and dead letters one row at a
/// time. With `contain`, every statement runs in its own savepoint and a row the database
/// refuses is reported as [`SettleResult::Failed`] after one more try as an `unrecordable`
/// dead letter; without it, the first refusal fails the call (the caller retries contained).
/// Returns one result per settlement, and the runs to promote again after COMMIT.
pub(crate) async fn settle<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    batch: &[Settlement<'_>],
    contain: bool,
) -> Result<(Vec<SettleResult>, Vec<StreamKey>), StoreError> {
    let mut results: Vec<Option<SettleResult>> = (0..batch.len()).map(|_| None).collect();
    let ids: Vec<String> = batch.iter().map(|s| s.event_id.to_string()).collect();
    let completed: Vec<usize> = (0..batch.len())
        .filter(|&i| matches!(batch[i].outcome, SettleOutcome::Completed { .. }))
        .collect();
    let released: Vec<usize> = (0..batch.len())
        .filter(|&i| matches!(batch[i].outcome, SettleOutcome::Release))
        .collect();

    let done = contained::<D, _>(conn, contain, async |c| {
        complete::<D>(c, token, now, batch, &ids, &completed).await
    })
    .await;
    match done {
        Ok(done) => {
            for &i in &completed {
                let key = (batch[i].destination, ids[i].as_str());
                results[i] = Some(if done.contains(&(key.0.to_owned(), key.1.to_owned())) {
                    SettleResult::Settled
                } else {
                    SettleResult::LeaseLost
                });
            }
        }
        Err(e) if !contain => return Err(e),
        // The bulk statement was refused: each completion alone.
        Err(_) => {
            for &i in &completed {
                let one = [i];
                let r = contained::<D, _>(conn, true, async |c| {
                    complete::<D>(c, token, now, batch, &ids, &one).await
                })
                .await;
                results[i] = Some(match r {
                    Ok(done) if !done.is_empty() => SettleResult::Settled,
                    Ok(_) => SettleResult::LeaseLost,
                    Err(e) => SettleResult::Failed(e),
                });
            }
        }
    }

    // A relay's completed publishes: what it published last per aggregate, with the
    // predecessor it named (read when its next event is published).
    let relayed: Vec<(&str, &str, &str, u64, u64)> = completed
        .iter()
        .filter(|&&i| matches!(results[i], Some(SettleResult::Settled)))
        .filter_map(|&i| {
            let s = &batch[i];
            let previous = s.relay_previous.filter(|_| s.sequence > 0)?;
            Some((
                s.destination,
                s.aggregate_type,
                s.aggregate_id,
                s.sequence,
                previous,
            ))
        })
        .collect();
    if !relayed.is_empty() {
        let recorded = contained::<D, _>(conn, contain, async |c| {
            super::chain::record_relayed::<D>(c, &relayed, now).await
        })
        .await;
        match recorded {
            Ok(()) => {}
            Err(e) if !contain => return Err(e),
            // The publishes stay completed; the next event of such an aggregate names an
            // earlier predecessor than the one it follows (the consumer's order check is
            // looser for that one event), never a later one.
            Err(e) => tracing::warn!(
                error = %event_core::ErrorChain(&e),
                "recording the relay chain failed"
            ),
        }
    }

    if !released.is_empty() {
        contained::<D, _>(conn, contain, async |c| {
            release::<D>(c, token, batch, &ids, &released).await
        })
        .await?;
        for &i in &released {
            results[i] = Some(SettleResult::Settled);
        }
    }

    for (i, s) in batch.iter().enumerate() {
        let r = match s.outcome {
            SettleOutcome::Retry {
                attempts,
                next_attempt_at,
                failed_at,
                error,
            } => {
                contained::<D, _>(conn, contain, async |c| {
                    retry::<D>(
                        c,
                        token,
                        failed_at,
                        s,
                        &ids[i],
                        attempts,
                        next_attempt_at,
                        error,
                    )
                    .await
                })
                .await
            }
            SettleOutcome::Dead {
                attempts,
                reason,
                failed_at,
                chain,
            } => {
                contained::<D, _>(conn, contain, async |c| {
                    dead::<D>(
                        c, token, now, failed_at, s, &ids[i], attempts, reason, chain,
                    )
                    .await
                })
                .await
            }
            SettleOutcome::Completed { .. } | SettleOutcome::Release => continue,
        };
        results[i] = Some(match r {
            Ok(true) => SettleResult::Settled,
            Ok(false) => SettleResult::LeaseLost,
            Err(e) if !contain => return Err(e),
            Err(e) => unrecordable::<D>(conn, token, now, s, &ids[i], e).await,
        });
    }

    // A completion makes the next delivery of its run the head.
    let mut streams: Vec<StreamKey> = Vec::new();
    let mut seen = HashSet::new();
    for (i, s) in batch.iter().enumerate() {
        if s.sequence > 0
            && matches!(s.outcome, SettleOutcome::Completed { .. })
            && matches!(results[i], Some(SettleResult::Settled))
        {
            let key = (
                s.destination.to_owned(),
                s.aggregate_type.to_owned(),
                s.aggregate_id.to_owned(),
            );
            if seen.insert(key.clone()) {
                streams.push(key);
            }
        }
    }
    let heads = contained::<D, _>(conn, contain, async |c| promote::<D>(c, &streams).await).await;
    let again = match heads {
        Ok(heads) => streams
            .into_iter()
            .filter(|s| !heads.contains_key(s))
            .collect(),
        Err(e) if !contain => return Err(e),
        // Promotion is repaired later (`repair_runs`): never a reason to lose the outcomes.
        Err(_) => streams,
    };
    let results = results
        .into_iter()
        .map(|r| r.unwrap_or(SettleResult::Settled))
        .collect();
    Ok((results, again))
}

/// Completes one delivery; false when its lease was lost.
pub(crate) async fn complete_one<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    s: &Settlement<'_>,
) -> Result<bool, StoreError> {
    let id = s.event_id.to_string();
    let n = execute::<D>(
        conn,
        "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL, attempts = attempts + 1 \
         WHERE handler = $3 AND event_id = $4 AND lease_token = $2",
        &[Arg::I64(now), Arg::Str(token), Arg::Str(s.destination), Arg::Str(&id)],
    )
    .await?;
    Ok(n == 1)
}

/// Completes `which` of `batch`; returns the keys completed (the others' leases were lost).
async fn complete<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    batch: &[Settlement<'_>],
    ids: &[String],
    which: &[usize],
) -> Result<HashSet<(String, String)>, StoreError> {
    let mut done = HashSet::new();
    let sql = format!(
        "UPDATE event_deliveries SET status = 'completed', completed_at = $1, lease_token = NULL, attempts = attempts + 1 \
         WHERE lease_token = $2 AND handler = $3 AND {} \
         RETURNING handler, event_id",
        D::text_in("event_id", "$4")
    );
    let keys = which
        .iter()
        .map(|&i| (batch[i].destination, ids[i].as_str()));
    for (destination, list) in super::by_destination(keys) {
        let args = [
            Arg::I64(now),
            Arg::Str(token),
            Arg::Str(destination),
            Arg::Str(&list),
        ];
        for r in rows::<D>(conn, &sql, &args).await? {
            done.insert((
                D::DB::get_string(&r, "handler").map_err(db)?,
                D::DB::get_string(&r, "event_id").map_err(db)?,
            ));
        }
    }
    Ok(done)
}

async fn release<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    batch: &[Settlement<'_>],
    ids: &[String],
    which: &[usize],
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE event_deliveries SET lease_token = NULL \
         WHERE lease_token = $1 AND handler = $2 AND {}",
        D::text_in("event_id", "$3")
    );
    let keys = which
        .iter()
        .map(|&i| (batch[i].destination, ids[i].as_str()));
    for (destination, list) in super::by_destination(keys) {
        execute::<D>(
            conn,
            &sql,
            &[Arg::Str(token), Arg::Str(destination), Arg::Str(&list)],
        )
        .await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn retry<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    failed_at: i64,
    s: &Settlement<'_>,
    id: &str,
    attempts: u32,
    next_attempt_at: i64,
    error: &str,
) -> Result<bool, StoreError> {
    let n = execute::<D>(
        conn,
        "UPDATE event_deliveries SET lease_token = NULL, next_attempt_at = $1, last_error = $2, attempts = $3, \
             first_failed_at = COALESCE(first_failed_at, $4), last_failed_at = $4 \
         WHERE handler = $5 AND event_id = $6 AND lease_token = $7",
        &[
            Arg::I64(next_attempt_at),
            Arg::Str(error),
            Arg::I64(i64::from(attempts)),
            Arg::I64(failed_at),
            Arg::Str(s.destination),
            Arg::Str(id),
            Arg::Str(token),
        ],
    )
    .await?;
    Ok(n == 1)
}

/// Moves a leased delivery to the dead letter queue, with the envelope copied from the
/// outbox byte for byte: dead at `now`, its last failure at `failed_at`. False when the lease
/// was lost.
#[allow(clippy::too_many_arguments)]
async fn dead<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    failed_at: i64,
    s: &Settlement<'_>,
    id: &str,
    attempts: u32,
    reason: &str,
    chain: &[String],
) -> Result<bool, StoreError> {
    let chain_json = serde_json::to_string(chain).unwrap_or_else(|_| "[]".into());
    let last = chain.join(": ");
    let updated = rows::<D>(
        conn,
        "UPDATE event_deliveries SET status = 'dead', lease_token = NULL, attempts = $1, last_error = $2, \
             first_failed_at = COALESCE(first_failed_at, $3), last_failed_at = $3 \
         WHERE handler = $4 AND event_id = $5 AND lease_token = $6 \
         RETURNING first_failed_at",
        &[
            Arg::I64(i64::from(attempts)),
            Arg::Str(&last),
            Arg::I64(failed_at),
            Arg::Str(s.destination),
            Arg::Str(id),
            Arg::Str(token),
        ],
    )
    .await?;
    let Some(row) = updated.first() else {
        return Ok(false);
    };
    let first_failed = D::DB::get_opt_i64(row, "first_failed_at")
        .map_err(db)?
        .unwrap_or(failed_at);
    execute::<D>(
        conn,
        "INSERT INTO event_dead_letters \
             (event_id, handler, name, version, envelope, attempts, first_failed_at, last_failed_at, reason, error_chain, dead_at) \
         SELECT o.event_id, $2, o.name, o.version, o.envelope, $3, $4, $5, $6, $7, $8 \
         FROM event_outbox o WHERE o.event_id = $1",
        &[
            Arg::Str(id),
            Arg::Str(s.destination),
            Arg::I64(i64::from(attempts)),
            Arg::I64(first_failed),
            Arg::I64(failed_at),
            Arg::Str(reason),
            Arg::Str(&chain_json),
            Arg::I64(now.max(failed_at)),
        ],
    )
    .await?;
    Ok(true)
}

/// The database refused to record a settlement: dead-letter the delivery with the fixed
/// reason `unrecordable` and the refusal (never the refused text), so that it neither blocks
/// its batch nor comes back for ever. When even that is refused, the row is left leased
/// (its lease expires and it is claimed again).
async fn unrecordable<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    now: i64,
    s: &Settlement<'_>,
    id: &str,
    refused: StoreError,
) -> SettleResult {
    let (attempts, failed_at) = match s.outcome {
        SettleOutcome::Retry {
            attempts,
            failed_at,
            ..
        }
        | SettleOutcome::Dead {
            attempts,
            failed_at,
            ..
        } => (attempts, failed_at),
        _ => (0, now),
    };
    let chain = vec![crate::outbox::text::storable(&format!(
        "the outcome of this delivery could not be recorded: {}",
        event_core::ErrorChain(&refused)
    ))];
    let r = contained::<D, _>(conn, true, async |c| {
        dead::<D>(
            c,
            token,
            now,
            failed_at,
            s,
            id,
            attempts,
            "unrecordable",
            &chain,
        )
        .await
    })
    .await;
    match r {
        Ok(true) => SettleResult::Settled,
        Ok(false) => SettleResult::LeaseLost,
        Err(_) => SettleResult::Failed(refused),
    }
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
    let r = rows::<D>(&mut conn, &sql, &[Arg::Str(&list)]).await?;
    let n = r
        .first()
        .map(|r| D::DB::get_i64(r, "n"))
        .transpose()
        .map_err(db)?
        .unwrap_or(0);
    Ok(n.max(0) as u64)
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
