//! Claiming runs, as statements any SQL dialect runs: select the ready heads, extend each
//! into its run, lease them, read their envelopes. A dialect with row locks it can skip
//! (PostgreSQL) claims in one statement of its own instead.

use sqlx::{Database, Pool};
use uuid::Uuid;

use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::{ClaimRequest, ClaimedDelivery};
use crate::store::StoreError;

/// The ready, due heads of runs of the destinations in `$2` at time `$1` (at most `$3`),
/// oldest first: not paused, not leased under a live lease, and with no earlier delivery of
/// their run pending or dead; `held_at` is the first held delivery of the run (where its
/// extension stops; NULL when none: one look-up in the partial index of held deliveries). `table` names the deliveries table as `d` (with an index hint
/// where the dialect needs one); `suffix` ends the statement (row locking).
pub(crate) fn heads_sql(table: &str, destinations: &str, suffix: &str) -> String {
    format!(
        "SELECT d.handler, d.event_id, d.aggregate_type, d.aggregate_id, d.sequence, d.next_attempt_at, \
                d.lease_token AS prior_token, \
                (SELECT MIN(y.sequence) FROM event_deliveries y WHERE y.held AND y.status = 'pending' \
                   AND y.handler = d.handler AND y.aggregate_type = d.aggregate_type \
                   AND y.aggregate_id = d.aggregate_id) AS held_at \
         FROM {table} \
         WHERE d.status = 'pending' AND d.ready AND NOT d.held AND d.next_attempt_at <= $1 \
           AND d.handler IN {destinations} \
           AND NOT EXISTS (SELECT 1 FROM event_paused_destinations z WHERE z.destination = d.handler \
               AND (z.expires_at IS NULL OR z.expires_at > $1)) \
           AND (d.lease_token IS NULL OR NOT EXISTS (SELECT 1 FROM event_leases l \
               WHERE l.token = d.lease_token AND l.expires_at >= $1)) \
           AND (d.sequence = 0 OR NOT EXISTS (SELECT 1 FROM event_deliveries p \
               WHERE p.handler = d.handler AND p.aggregate_type = d.aggregate_type \
                 AND p.aggregate_id = d.aggregate_id AND p.sequence < d.sequence \
                 AND p.status IN ('pending', 'dead'))) \
         ORDER BY d.next_attempt_at LIMIT $3 {suffix}"
    )
}

/// The columns a claimed delivery is read from, `d` the deliveries and `o` the outbox.
pub(crate) const CLAIMED_COLUMNS: &str =
    "d.handler, d.event_id, d.aggregate_type, d.aggregate_id, d.sequence, d.attempts, \
     d.first_failed_at, o.name, o.version, o.envelope";

pub(crate) fn claimed_from_row<D: Dialect>(
    r: &<D::DB as Database>::Row,
) -> Result<ClaimedDelivery, StoreError> {
    let id = D::DB::get_string(r, "event_id").map_err(db)?;
    Ok(ClaimedDelivery {
        destination: D::DB::get_string(r, "handler").map_err(db)?,
        event_id: Uuid::parse_str(&id)
            .map_err(|e| StoreError::Corrupt(format!("event_deliveries.event_id {id:?}: {e}")))?,
        aggregate_type: D::DB::get_string(r, "aggregate_type").map_err(db)?,
        aggregate_id: D::DB::get_string(r, "aggregate_id").map_err(db)?,
        sequence: D::DB::get_i64(r, "sequence").map_err(db)?.max(0) as u64,
        attempts: D::DB::get_i64(r, "attempts")
            .map_err(db)?
            .clamp(0, i64::from(u32::MAX)) as u32,
        first_failed_at: D::DB::get_opt_i64(r, "first_failed_at").map_err(db)?,
        name: D::DB::get_string(r, "name").map_err(db)?,
        version: D::DB::get_i64(r, "version")
            .map_err(db)?
            .clamp(0, i64::from(u32::MAX)) as u32,
        envelope: D::DB::get_string(r, "envelope").map_err(db)?,
        relay_previous: None,
    })
}

/// Sorts claimed deliveries into runs: by destination, aggregate and sequence.
pub(crate) fn in_run_order(mut claimed: Vec<ClaimedDelivery>) -> Vec<ClaimedDelivery> {
    claimed.sort_by(|a, b| {
        (
            &a.destination,
            &a.aggregate_type,
            &a.aggregate_id,
            a.sequence,
            a.event_id,
        )
            .cmp(&(
                &b.destination,
                &b.aggregate_type,
                &b.aggregate_id,
                b.sequence,
                b.event_id,
            ))
    });
    claimed
}

/// The next `quota` pending deliveries after each run's head, in sequence order: one
/// statement per 100 runs, each run its own `LIMIT`ed range of the (handler, aggregate,
/// sequence) index (so that a long backlog behind a head is never read).
// Used by the SQLite dialect (serialised writers).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
async fn followers<D: Dialect>(
    conn: &mut Conn<D>,
    runs: &[(String, String, String, i64, i64)],
    quota: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut followers = Vec::new();
    for chunk in runs.chunks(100) {
        let mut args = vec![Arg::I64(quota)];
        let mut parts = Vec::with_capacity(chunk.len());
        for (i, (handler, agg_type, agg_id, sequence, held_at)) in chunk.iter().enumerate() {
            let p = 2 + i * 5;
            // `status IN (…)` repeats the index's condition so that SQLite's planner uses the
            // (handler, aggregate, sequence) index of pending and dead deliveries.
            parts.push(format!(
                "SELECT * FROM (SELECT handler, event_id FROM event_deliveries \
                 WHERE handler = ${} AND aggregate_type = ${} AND aggregate_id = ${} \
                 AND status IN ('pending', 'dead') AND status = 'pending' AND sequence > ${} \
                 AND sequence < ${} \
                 ORDER BY sequence LIMIT $1)",
                p,
                p + 1,
                p + 2,
                p + 3,
                p + 4
            ));
            args.extend([
                Arg::Str(handler),
                Arg::Str(agg_type),
                Arg::Str(agg_id),
                Arg::I64(*sequence),
                Arg::I64(*held_at),
            ]);
        }
        for r in rows::<D>(conn, &parts.join(" UNION ALL "), &args).await? {
            followers.push((
                D::DB::get_string(&r, "handler").map_err(db)?,
                D::DB::get_string(&r, "event_id").map_err(db)?,
            ));
        }
    }
    Ok(followers)
}

/// Claims in one transaction of several statements: for a dialect whose writers are
/// serialised (SQLite), so that no other claim runs in between.
// Used by the SQLite dialect (serialised writers).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) async fn claim_in_steps<D: Dialect>(
    pool: &Pool<D::DB>,
    req: &ClaimRequest<'_>,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let destinations = serde_json::to_string(req.destinations).unwrap_or_else(|_| "[]".into());
    let mut tx = D::begin(pool).await.map_err(db)?;
    let conn: &mut Conn<D> = &mut tx;
    let heads = rows::<D>(
        conn,
        &heads_sql(D::HEADS_TABLE, &D::json_text_array("$2"), ""),
        &[
            Arg::I64(req.now),
            Arg::Str(&destinations),
            Arg::I64(req.max_runs.max(1) as i64),
        ],
    )
    .await?;
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    super::delivery::upsert_lease::<D>(conn, req).await?;
    let quota = (req.max_deliveries / heads.len()).max(1) as i64;
    let mut head_keys: Vec<(String, String)> = Vec::with_capacity(heads.len());
    // (handler, aggregate type, aggregate id, sequence, first held sequence) of the heads
    // whose runs extend.
    let mut runs: Vec<(String, String, String, i64, i64)> = Vec::new();
    for h in &heads {
        let handler = D::DB::get_string(h, "handler").map_err(db)?;
        let event_id = D::DB::get_string(h, "event_id").map_err(db)?;
        let sequence = D::DB::get_i64(h, "sequence").map_err(db)?;
        if sequence > 0 && quota > 1 {
            runs.push((
                handler.clone(),
                D::DB::get_string(h, "aggregate_type").map_err(db)?,
                D::DB::get_string(h, "aggregate_id").map_err(db)?,
                sequence,
                D::DB::get_opt_i64(h, "held_at")
                    .map_err(db)?
                    .unwrap_or(i64::MAX),
            ));
        }
        head_keys.push((handler, event_id));
    }
    let followers = followers::<D>(conn, &runs, quota - 1).await?;
    // A head leased under a dead lease was probably being delivered when its worker died: it
    // counts as attempted once, so that an event that kills its process ends in the dead
    // letter queue after the retry limit instead of killing every worker in turn.
    lease::<D>(
        conn,
        req.token,
        &head_keys,
        "attempts = attempts + CASE WHEN lease_token IS NULL THEN 0 ELSE 1 END, ",
    )
    .await?;
    lease::<D>(conn, req.token, &followers, "").await?;
    let mut claimed = Vec::with_capacity(head_keys.len() + followers.len());
    let fetch = format!(
        "SELECT {CLAIMED_COLUMNS} FROM event_deliveries d JOIN event_outbox o ON o.event_id = d.event_id \
         WHERE d.handler = $1 AND {}",
        D::text_in("d.event_id", "$2")
    );
    let keys = head_keys
        .iter()
        .chain(&followers)
        .map(|(h, e)| (h.as_str(), e.as_str()));
    for (destination, list) in super::by_destination(keys) {
        for r in rows::<D>(conn, &fetch, &[Arg::Str(destination), Arg::Str(&list)]).await? {
            claimed.push(claimed_from_row::<D>(&r)?);
        }
    }
    tx.commit().await.map_err(db)?;
    Ok(in_run_order(claimed))
}

// Used by the SQLite dialect (serialised writers).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
async fn lease<D: Dialect>(
    conn: &mut Conn<D>,
    token: &str,
    keys: &[(String, String)],
    also: &str,
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE event_deliveries SET {also}lease_token = $1 WHERE handler = $2 AND {}",
        D::text_in("event_id", "$3")
    );
    let keys = keys.iter().map(|(h, e)| (h.as_str(), e.as_str()));
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
