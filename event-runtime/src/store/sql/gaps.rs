//! Gaps in received aggregates' chains, as statements any SQL dialect runs: opening them
//! (`event_inbox_gaps`), listing, accepting (the missing place skipped, what follows
//! released), the skip of a purged dead letter's place, and the count of held events. The
//! chains themselves are `chain`'s.

use std::collections::BTreeSet;

use sqlx::Pool;
use uuid::Uuid;

use super::append::StreamKey;
use super::chain::{close_gaps, i64_of, lock_aggregates, release, AggKey};
use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::Gap;
use crate::store::StoreError;

/// Opens a gap for every held place recorded at or before `older_than` whose predecessor did
/// not arrive (absent, or a dead letter here), unless one is open for it already; at most
/// `limit`. Returns the gaps opened.
pub(crate) async fn open_gaps<D: Dialect>(
    pool: &Pool<D::DB>,
    older_than: i64,
    now: i64,
    limit: usize,
) -> Result<Vec<Gap>, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    let conn: &mut Conn<D> = &mut tx;
    let found = rows::<D>(
        conn,
        "SELECT c.aggregate_type, c.aggregate_id, c.previous, c.sequence, c.event_id, c.recorded_at, \
                (SELECT MIN(l.id) FROM event_dead_letters l JOIN event_inbox_chain p \
                   ON p.event_id = l.event_id AND p.aggregate_type = c.aggregate_type \
                  AND p.aggregate_id = c.aggregate_id AND p.sequence = c.previous AND p.state = 'dead' \
                 WHERE l.kind = 'inbox' AND l.resolved_at IS NULL) AS dead_letter_id \
         FROM event_inbox_chain c \
         WHERE c.state = 'held' AND c.recorded_at <= $1 \
           AND NOT EXISTS (SELECT 1 FROM event_inbox_chain p WHERE p.aggregate_type = c.aggregate_type \
               AND p.aggregate_id = c.aggregate_id AND p.sequence = c.previous AND p.state <> 'dead') \
           AND NOT EXISTS (SELECT 1 FROM event_inbox_gaps g WHERE g.closed_at IS NULL \
               AND g.aggregate_type = c.aggregate_type AND g.aggregate_id = c.aggregate_id \
               AND g.missing_sequence = c.previous) \
         ORDER BY c.recorded_at LIMIT $2",
        &[Arg::I64(older_than), Arg::I64(limit as i64)],
    )
    .await?;
    let mut gaps = Vec::with_capacity(found.len());
    for r in &found {
        let aggregate_type = D::DB::get_string(r, "aggregate_type").map_err(db)?;
        let aggregate_id = D::DB::get_string(r, "aggregate_id").map_err(db)?;
        let missing = D::DB::get_i64(r, "previous").map_err(db)?;
        let waiting = D::DB::get_i64(r, "sequence").map_err(db)?;
        let waiting_id = D::DB::get_string(r, "event_id").map_err(db)?;
        let since = D::DB::get_i64(r, "recorded_at").map_err(db)?;
        let dead_letter_id = D::DB::get_opt_i64(r, "dead_letter_id").map_err(db)?;
        let id = rows::<D>(
            conn,
            "INSERT INTO event_inbox_gaps (aggregate_type, aggregate_id, missing_sequence, waiting_sequence, \
                 waiting_event_id, waiting_since, dead_letter_id, opened_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
            &[
                Arg::Str(&aggregate_type),
                Arg::Str(&aggregate_id),
                Arg::I64(missing),
                Arg::I64(waiting),
                Arg::Str(&waiting_id),
                Arg::I64(since),
                Arg::OptI64(dead_letter_id),
                Arg::I64(now),
            ],
        )
        .await?;
        let id = id
            .first()
            .map(|r| D::DB::get_i64(r, "id"))
            .transpose()
            .map_err(db)?
            .unwrap_or_default();
        gaps.push(Gap {
            id,
            aggregate_type,
            aggregate_id,
            missing_sequence: missing.max(0) as u64,
            waiting_sequence: waiting.max(0) as u64,
            waiting_event_id: Uuid::parse_str(&waiting_id).unwrap_or_default(),
            waiting_since: since,
            dead_letter_id,
            opened_at: now,
            closed_at: None,
            resolution: None,
        });
    }
    tx.commit().await.map_err(db)?;
    Ok(gaps)
}

/// Received events held now.
pub(crate) async fn held_events<D: Dialect>(pool: &Pool<D::DB>) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    const HELD: &str = "SELECT COUNT(*) AS n FROM event_inbox_chain WHERE state = 'held'";
    super::count::<D>(&mut conn, HELD, &[]).await
}

/// The columns a [`Gap`] is read from.
const GAP_COLUMNS: &str = "id, aggregate_type, aggregate_id, missing_sequence, waiting_sequence, \
     waiting_event_id, waiting_since, dead_letter_id, opened_at, closed_at, resolution";

fn gap_from_row<D: Dialect>(r: &<D::DB as sqlx::Database>::Row) -> Result<Gap, StoreError> {
    let waiting = D::DB::get_string(r, "waiting_event_id").map_err(db)?;
    Ok(Gap {
        id: D::DB::get_i64(r, "id").map_err(db)?,
        aggregate_type: D::DB::get_string(r, "aggregate_type").map_err(db)?,
        aggregate_id: D::DB::get_string(r, "aggregate_id").map_err(db)?,
        missing_sequence: D::DB::get_i64(r, "missing_sequence").map_err(db)?.max(0) as u64,
        waiting_sequence: D::DB::get_i64(r, "waiting_sequence").map_err(db)?.max(0) as u64,
        waiting_event_id: Uuid::parse_str(&waiting).map_err(|e| {
            StoreError::Corrupt(format!(
                "event_inbox_gaps.waiting_event_id {waiting:?}: {e}"
            ))
        })?,
        waiting_since: D::DB::get_i64(r, "waiting_since").map_err(db)?,
        dead_letter_id: D::DB::get_opt_i64(r, "dead_letter_id").map_err(db)?,
        opened_at: D::DB::get_i64(r, "opened_at").map_err(db)?,
        closed_at: D::DB::get_opt_i64(r, "closed_at").map_err(db)?,
        resolution: D::DB::get_opt_string(r, "resolution").map_err(db)?,
    })
}

/// Gaps, oldest first: the open ones (or every one with `all`), with an id above `after`, at
/// most `limit`.
pub(crate) async fn gaps<D: Dialect>(
    pool: &Pool<D::DB>,
    all: bool,
    after: i64,
    limit: usize,
) -> Result<Vec<Gap>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let sql = format!(
        "SELECT {GAP_COLUMNS} FROM event_inbox_gaps WHERE ($1 OR closed_at IS NULL) AND id > $2 \
         ORDER BY id LIMIT $3"
    );
    rows::<D>(
        &mut conn,
        &sql,
        &[Arg::Bool(all), Arg::I64(after), Arg::I64(limit as i64)],
    )
    .await?
    .iter()
    .map(gap_from_row::<D>)
    .collect()
}

/// Accepts the open gaps `ids` in the open transaction `conn` under audit row `audit_id`:
/// each missing place is skipped (a dead letter's place too) and the held events after it
/// are released in chain order. Returns the gaps accepted and the runs to promote.
pub(crate) async fn accept_gaps<D: Dialect>(
    conn: &mut Conn<D>,
    ids: &[i64],
    audit_id: i64,
    now: i64,
) -> Result<(Vec<Gap>, Vec<StreamKey>), StoreError> {
    let mut accepted = Vec::new();
    for &id in ids {
        let sql = format!(
            "UPDATE event_inbox_gaps SET closed_at = $1, resolution = 'accepted', audit_id = $2 \
             WHERE id = $3 AND closed_at IS NULL RETURNING {GAP_COLUMNS}"
        );
        for r in rows::<D>(
            conn,
            &sql,
            &[Arg::I64(now), Arg::I64(audit_id), Arg::I64(id)],
        )
        .await?
        {
            accepted.push(gap_from_row::<D>(&r)?);
        }
    }
    let aggregates: BTreeSet<AggKey> = accepted
        .iter()
        .map(|g| (g.aggregate_type.clone(), g.aggregate_id.clone()))
        .collect();
    let aggregates: Vec<AggKey> = aggregates.into_iter().collect();
    lock_aggregates::<D>(conn, &aggregates, now).await?;
    for g in &accepted {
        execute::<D>(
            conn,
            "INSERT INTO event_inbox_chain (aggregate_type, aggregate_id, sequence, previous, state, event_id, recorded_at) \
             VALUES ($1, $2, $3, 0, 'skipped', $4, $5) \
             ON CONFLICT (aggregate_type, aggregate_id, sequence) DO UPDATE SET state = 'skipped' \
             WHERE event_inbox_chain.state = 'dead'",
            &[
                Arg::Str(&g.aggregate_type),
                Arg::Str(&g.aggregate_id),
                Arg::I64(i64_of(g.missing_sequence)),
                Arg::Str(&Uuid::nil().to_string()),
                Arg::I64(now),
            ],
        )
        .await?;
    }
    let (_, streams) = release::<D>(conn, &aggregates).await?;
    Ok((accepted, streams))
}

/// Skips the places of the inbox dead letters `event_ids` that hold their successors (a
/// purge accepts the gap it left: an open gap there closes as `accepted`) and releases what
/// follows. Returns the runs to promote.
pub(crate) async fn skip_dead_places<D: Dialect>(
    conn: &mut Conn<D>,
    event_ids: &[String],
    now: i64,
) -> Result<Vec<StreamKey>, StoreError> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = serde_json::to_string(event_ids).unwrap_or_else(|_| "[]".into());
    let sql = format!(
        "UPDATE event_inbox_chain SET state = 'skipped' WHERE state = 'dead' AND {} \
         RETURNING aggregate_type, aggregate_id, sequence",
        D::text_in("event_id", "$1")
    );
    let mut aggregates = BTreeSet::new();
    let mut skipped = Vec::new();
    for r in rows::<D>(conn, &sql, &[Arg::Str(&list)]).await? {
        let key = (
            D::DB::get_string(&r, "aggregate_type").map_err(db)?,
            D::DB::get_string(&r, "aggregate_id").map_err(db)?,
        );
        skipped.push((key.clone(), D::DB::get_i64(&r, "sequence").map_err(db)?));
        aggregates.insert(key);
    }
    // Their open gaps are accepted by the purge.
    let places: Vec<(&str, &str, u64)> = skipped
        .iter()
        .map(|((t, i), s)| (t.as_str(), i.as_str(), (*s).max(0) as u64))
        .collect();
    close_gaps::<D>(conn, &places, "accepted", now).await?;
    let aggregates: Vec<AggKey> = aggregates.into_iter().collect();
    Ok(release::<D>(conn, &aggregates).await?.1)
}
