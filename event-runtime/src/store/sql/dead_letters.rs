//! The dead letter queue of the SQL store: listing, replay and purge with their audit row,
//! the audit log, and the pending envelopes a pre-deploy check decodes. Decides nothing about
//! what to dead-letter: the engine does.

use sqlx::{Database, Pool};
use uuid::Uuid;

use super::append::{promote, StreamKey};
use super::audit::{self, NewAudit};
use super::exec::{Arg, SqlExec};
use super::{db, rows, Conn, Dialect};
use crate::store::backend::{AuditStamp, PendingEnvelope};
use crate::store::types::{AuditEntry, DeadLetter, DeadLetterFilter, Resolution};
use crate::store::{from_ms, StoreError};

fn dead_letter_from_row<D: Dialect>(
    r: &<D::DB as Database>::Row,
) -> Result<DeadLetter, StoreError> {
    let chain = D::DB::get_string(r, "error_chain").map_err(db)?;
    let event_id = D::DB::get_string(r, "event_id").map_err(db)?;
    let reason = D::DB::get_string(r, "reason").map_err(db)?;
    Ok(DeadLetter {
        id: D::DB::get_i64(r, "id").map_err(db)?,
        event_id: Uuid::parse_str(&event_id)
            .map_err(|e| StoreError::Corrupt(format!("dead letter event_id {event_id:?}: {e}")))?,
        handler: D::DB::get_string(r, "handler").map_err(db)?,
        event_name: D::DB::get_string(r, "name").map_err(db)?,
        event_version: D::DB::get_i64(r, "version").map_err(db)? as u32,
        envelope: D::DB::get_string(r, "envelope").map_err(db)?,
        attempts: D::DB::get_i64(r, "attempts").map_err(db)? as u32,
        first_failed_at: from_ms(D::DB::get_i64(r, "first_failed_at").map_err(db)?),
        last_failed_at: from_ms(D::DB::get_i64(r, "last_failed_at").map_err(db)?),
        reason: reason.parse().unwrap_or_else(|never| match never {}),
        error_chain: serde_json::from_str(&chain)
            .map_err(|e| StoreError::Corrupt(format!("dead letter error_chain: {e}")))?,
        dead_at: from_ms(D::DB::get_i64(r, "dead_at").map_err(db)?),
        resolved_at: D::DB::get_opt_i64(r, "resolved_at")
            .map_err(db)?
            .map(from_ms),
        resolution: D::DB::get_opt_string(r, "resolution").map_err(db)?,
        held_back: D::DB::get_i64(r, "held_back").map_err(db)?.max(0) as u64,
        origin: D::DB::get_opt_string(r, "origin")
            .map_err(db)?
            .map(|o| serde_json::from_str(&o))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("dead letter origin: {e}")))?,
    })
}

/// The `WHERE` of a [`DeadLetterFilter`] over `event_dead_letters`, its values `$1` to `$6`
/// ([`filter_args`]): a literal, so that the statements it ends stay constants.
macro_rules! dead_letter_filter {
    () => {
        "WHERE ($1 OR resolved_at IS NULL)
          AND ($2 IS NULL OR handler = $2)
          AND ($3 IS NULL OR name = $3)
          AND ($4 IS NULL OR dead_at >= $4)
          AND ($5 IS NULL OR dead_at < $5)
          AND ($6 IS NULL OR id = $6)"
    };
}
pub(crate) use dead_letter_filter;

/// The values of [`dead_letter_filter!`]'s `$1` to `$6`.
pub(crate) fn filter_args(filter: &DeadLetterFilter) -> [Arg<'_>; 6] {
    [
        Arg::Bool(filter.include_resolved),
        Arg::OptStr(filter.handler.as_deref()),
        Arg::OptStr(filter.event_name.as_deref()),
        Arg::OptI64(filter.since.map(|t| t.timestamp_millis())),
        Arg::OptI64(filter.until.map(|t| t.timestamp_millis())),
        Arg::OptI64(filter.id),
    ]
}

pub(crate) async fn list<D: Dialect>(
    pool: &Pool<D::DB>,
    filter: &DeadLetterFilter,
) -> Result<Vec<DeadLetter>, StoreError> {
    const SQL: &str = concat!(
        "SELECT id, event_id, handler, name, version, envelope, attempts, first_failed_at,
            last_failed_at, reason, error_chain, dead_at, resolved_at, resolution,
            CASE WHEN resolved_at IS NOT NULL THEN 0 ELSE COALESCE((
                SELECT COUNT(*) FROM event_deliveries h JOIN event_deliveries f
                  ON f.handler = h.handler AND f.aggregate_type = h.aggregate_type
                 AND f.aggregate_id = h.aggregate_id AND f.sequence > h.sequence
                WHERE h.handler = event_dead_letters.handler AND h.event_id = event_dead_letters.event_id
                  AND h.status = 'dead' AND h.sequence > 0
                  AND f.status IN ('pending', 'dead') AND f.status = 'pending'), 0) END AS held_back, origin
        FROM event_dead_letters ",
        dead_letter_filter!(),
        " ORDER BY id LIMIT $7"
    );
    let mut conn = pool.acquire().await.map_err(db)?;
    let limit = filter.limit.map_or(i64::MAX, i64::from);
    let [a1, a2, a3, a4, a5, a6] = filter_args(filter);
    rows::<D>(&mut conn, SQL, &[a1, a2, a3, a4, a5, a6, Arg::I64(limit)])
        .await?
        .iter()
        .map(dead_letter_from_row::<D>)
        .collect()
}

/// Replays or purges the open dead letter `id` on `conn` (the caller's transaction), naming
/// `audit_id` as the operation that did it when the audit row exists already. Returns `None`
/// when it is not open, else the run a purge unblocked (to promote).
pub(crate) async fn resolve_one<D: Dialect>(
    conn: &mut Conn<D>,
    id: i64,
    action: Resolution,
    now: i64,
    audit_id: Option<i64>,
) -> Result<Option<Option<StreamKey>>, StoreError> {
    // An inbox's dead letter has no delivery to replay: its inbox replays it (it decodes).
    const MARK: &str =
        "UPDATE event_dead_letters SET resolved_at = $1, resolution = $2, audit_id = $4
        WHERE id = $3 AND resolved_at IS NULL AND ($2 = 'purged' OR kind = 'delivery')
        RETURNING handler, event_id";
    // A replayed delivery is the head of its run again (it was when it died).
    const REPLAY: &str = "UPDATE event_deliveries SET status = 'pending', attempts = 0, next_attempt_at = $1,
            lease_token = NULL, ready = TRUE, last_error = NULL, first_failed_at = NULL, last_failed_at = NULL
        WHERE handler = $2 AND event_id = $3 AND status = 'dead'
        RETURNING aggregate_type, aggregate_id";
    const PURGE: &str = "UPDATE event_deliveries SET status = 'purged', lease_token = NULL
        WHERE handler = $2 AND event_id = $3 AND status = 'dead' AND $1 >= 0
        RETURNING aggregate_type, aggregate_id";
    let (label, delivery_sql) = match action {
        Resolution::Replay => ("replayed", REPLAY),
        Resolution::Purge => ("purged", PURGE),
    };
    let marked = rows::<D>(
        conn,
        MARK,
        &[
            Arg::I64(now),
            Arg::Str(label),
            Arg::I64(id),
            Arg::OptI64(audit_id),
        ],
    )
    .await?;
    let Some(r) = marked.first() else {
        return Ok(None);
    };
    let handler = D::DB::get_string(r, "handler").map_err(db)?;
    let event_id = D::DB::get_string(r, "event_id").map_err(db)?;
    let changed = rows::<D>(
        conn,
        delivery_sql,
        &[Arg::I64(now), Arg::Str(&handler), Arg::Str(&event_id)],
    )
    .await?;
    let mut stream = None;
    if action == Resolution::Purge {
        // A purged inbox dead letter that held the events after it in its aggregate's chain
        // accepts the gap it leaves: they are released (their runs made ready now; the
        // periodic run repair covers a commit that raced it).
        let released =
            super::gaps::skip_dead_places::<D>(conn, std::slice::from_ref(&event_id), now).await?;
        if !released.is_empty() {
            promote::<D>(conn, &released).await?;
        }
        if let Some(r) = changed.first() {
            stream = Some((
                handler,
                D::DB::get_string(r, "aggregate_type").map_err(db)?,
                D::DB::get_string(r, "aggregate_id").map_err(db)?,
            ));
        }
    }
    Ok(Some(stream))
}

/// Promotes the runs `streams` a purge unblocked; returns those to promote again after
/// COMMIT where the dialect needs it.
pub(crate) async fn unblock<D: Dialect>(
    conn: &mut Conn<D>,
    streams: Vec<StreamKey>,
) -> Result<Vec<StreamKey>, StoreError> {
    let heads = promote::<D>(conn, &streams).await?;
    Ok(streams
        .into_iter()
        .filter(|s| !heads.contains_key(s))
        .collect())
}

/// Replays or purges the open dead letters `ids` on `conn` (the caller's transaction), with
/// one audit row. Returns the audit row and the runs a purge unblocked (to promote again
/// after COMMIT where the dialect needs it).
pub(crate) async fn resolve<D: Dialect>(
    conn: &mut Conn<D>,
    ids: &[i64],
    action: Resolution,
    stamp: &AuditStamp<'_>,
    progress: &mut (dyn FnMut(usize) + Send),
) -> Result<(AuditEntry, Vec<StreamKey>), StoreError> {
    let now = stamp.at;
    let action_name = action_name(action);
    let mut entry = audit::insert::<D>(conn, &NewAudit::finished(action_name, *stamp)).await?;
    let audit_id = entry.id;
    let mut done = Vec::new();
    let mut streams = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        if let Some(stream) = resolve_one::<D>(conn, id, action, now, Some(audit_id)).await? {
            streams.extend(stream);
            done.push(id);
        }
        progress(i + 1);
    }
    // A purge lets the next delivery of the run flow.
    let again = unblock::<D>(conn, streams).await?;
    audit::name_dead_letters::<D>(conn, &mut entry, done).await?;
    Ok((entry, again))
}

pub(crate) fn action_name(action: Resolution) -> &'static str {
    match action {
        Resolution::Replay => "replay",
        Resolution::Purge => "purge",
    }
}

pub(crate) async fn audit_log<D: Dialect>(
    pool: &Pool<D::DB>,
    limit: u32,
) -> Result<Vec<AuditEntry>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(
        &mut conn,
        "SELECT id, action, actor, reason, at, dead_letter_ids, count, selection, finished_at
         FROM event_audit_log ORDER BY id DESC LIMIT $1",
        &[Arg::I64(i64::from(limit))],
    )
    .await?
    .iter()
    .map(audit::from_row::<D>)
    .collect()
}

pub(crate) async fn pending_envelopes<D: Dialect>(
    pool: &Pool<D::DB>,
) -> Result<Vec<PendingEnvelope>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(
        &mut conn,
        "SELECT d.handler, d.event_id, o.envelope FROM event_deliveries d
         JOIN event_outbox o ON o.event_id = d.event_id WHERE d.status = 'pending' ORDER BY o.recorded_at",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(PendingEnvelope {
            destination: D::DB::get_string(r, "handler").map_err(db)?,
            event_id: D::DB::get_string(r, "event_id").map_err(db)?,
            envelope: D::DB::get_string(r, "envelope").map_err(db)?,
        })
    })
    .collect()
}
