//! Purging or re-targeting what a destination that no longer exists left in the store, in
//! pages: its pending deliveries and open dead letters are given up on, or moved onto another
//! destination and merged into that destination's runs (ready heads recomputed, a delivery of
//! an event the other destination already has dropped as a duplicate). Each page is one
//! transaction that also counts itself in the operation's audit row; what a page did is no
//! longer the old destination's, so the next page (or a re-run after a crash) starts after it.
//! Decides nothing about which destinations are registered: the caller does.

use crate::store::backend::AuditStamp;
use sqlx::Pool;

use super::append::StreamKey;
use super::audit::{self, COLUMNS as AUDIT_COLUMNS};
use super::dead_letters::unblock;
use super::exec::{placeholders, Arg, SqlExec};
use super::{commit_and_promote, db, execute, rows, Conn, Dialect};
use crate::store::backend::{DestinationOperation, DestinationPage};
use crate::store::types::AuditEntry;
use crate::store::StoreError;

/// Runs per statement of the ready-flag reset (three parameters each).
const RUNS_PER_STATEMENT: usize = 200;

fn selection(op: &DestinationOperation) -> Result<String, StoreError> {
    serde_json::to_string(op).map_err(|e| StoreError::Corrupt(format!("selection: {e}")))
}

/// Refuses when a live worker holds a delivery of `op.from`; continues the unfinished
/// operation of the same kind on the same destinations if there is one, else writes a new
/// audit row, unfinished.
pub(crate) async fn start<D: Dialect>(
    pool: &Pool<D::DB>,
    op: &DestinationOperation,
    stamp: &AuditStamp<'_>,
) -> Result<AuditEntry, StoreError> {
    let now = stamp.at;
    if op.to.as_deref() == Some(op.from.as_str()) {
        return Err(StoreError::SameDestination {
            destination: op.from.clone(),
        });
    }
    let json = selection(op)?;
    let mut tx = D::begin(pool).await.map_err(db)?;
    refuse_leased::<D>(&mut tx, &op.from, now).await?;
    let unfinished = format!(
        "SELECT {AUDIT_COLUMNS} FROM event_audit_log \
         WHERE action = $1 AND selection = $2 AND finished_at IS NULL ORDER BY id DESC LIMIT 1"
    );
    if let Some(entry) = rows::<D>(
        &mut tx,
        &unfinished,
        &[Arg::Str(op.action()), Arg::Str(&json)],
    )
    .await?
    .first()
    .map(audit::from_row::<D>)
    .transpose()?
    {
        tx.commit().await.map_err(db)?;
        return Ok(entry);
    }
    let entry = super::resolution::insert_audit::<D>(&mut tx, op.action(), stamp, &json).await?;
    tx.commit().await.map_err(db)?;
    Ok(entry)
}

/// [`StoreError::DestinationInUse`] when a live worker (of any process) holds a delivery of
/// `destination`: that process still delivers it.
async fn refuse_leased<D: Dialect>(
    conn: &mut Conn<D>,
    destination: &str,
    now: i64,
) -> Result<(), StoreError> {
    const LEASED: &str = "SELECT COUNT(*) AS n FROM event_deliveries d
        WHERE d.handler = $1 AND d.status = 'pending' AND d.lease_token IS NOT NULL
          AND EXISTS (SELECT 1 FROM event_leases l WHERE l.token = d.lease_token AND l.expires_at >= $2)";
    let leased = super::count::<D>(conn, LEASED, &[Arg::Str(destination), Arg::I64(now)]).await?;
    if leased > 0 {
        return Err(StoreError::DestinationInUse {
            destination: destination.to_owned(),
            leased: leased as u64,
        });
    }
    Ok(())
}

/// One page of at most `page` deliveries of `op.from` (pending or dead, in run order), or,
/// once none is left, of its open dead letters that have no delivery row; `selected` 0 when
/// nothing is left.
pub(crate) async fn page<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
    op: &DestinationOperation,
    page: u32,
    now: i64,
) -> Result<DestinationPage, StoreError> {
    // The (handler, aggregate, sequence) index of pending and dead deliveries, in run order.
    const SELECT: &str = "SELECT event_id, status, aggregate_type, aggregate_id
        FROM event_deliveries WHERE handler = $1 AND status IN ('pending', 'dead')
        ORDER BY aggregate_type, aggregate_id, sequence, event_id LIMIT $2";
    let mut tx = D::begin(pool).await.map_err(db)?;
    // A process that has the destination after all stops the operation where it is.
    refuse_leased::<D>(&mut tx, &op.from, now).await?;
    let selected: Vec<(String, bool, String, String)> = rows::<D>(
        &mut tx,
        SELECT,
        &[Arg::Str(&op.from), Arg::I64(i64::from(page))],
    )
    .await?
    .iter()
    .map(|r| {
        Ok((
            D::DB::get_string(r, "event_id").map_err(db)?,
            D::DB::get_string(r, "status").map_err(db)? == "pending",
            D::DB::get_string(r, "aggregate_type").map_err(db)?,
            D::DB::get_string(r, "aggregate_id").map_err(db)?,
        ))
    })
    .collect::<Result<_, StoreError>>()?;
    let (done, again) = if selected.is_empty() {
        (
            orphans::<D>(&mut tx, audit_id, op, page, now).await?,
            Vec::new(),
        )
    } else {
        deliveries::<D>(&mut tx, audit_id, op, &selected, now).await?
    };
    let touched = done.deliveries + done.dead_letters + done.duplicates;
    super::audit::add_to_count::<D>(&mut tx, audit_id, touched).await?;
    commit_and_promote::<D>(tx, pool, &again).await?;
    Ok(done)
}

/// Gives up on the deliveries `ids` of `from` (pending or dead) and on their open dead
/// letters. Returns the dead letters resolved.
async fn purge_rows<D: Dialect>(
    conn: &mut Conn<D>,
    audit_id: i64,
    from: &str,
    ids: &str,
    now: i64,
) -> Result<u64, StoreError> {
    let deliveries = format!(
        "UPDATE event_deliveries SET status = 'purged', lease_token = NULL \
         WHERE handler = $1 AND status IN ('pending', 'dead') AND {}",
        D::text_in("event_id", "$2")
    );
    let letters = format!(
        "UPDATE event_dead_letters SET resolved_at = $3, resolution = 'purged', audit_id = $4 \
         WHERE handler = $1 AND resolved_at IS NULL AND kind = 'delivery' AND {}",
        D::text_in("event_id", "$2")
    );
    execute::<D>(conn, &deliveries, &[Arg::Str(from), Arg::Str(ids)]).await?;
    execute::<D>(
        conn,
        &letters,
        &[
            Arg::Str(from),
            Arg::Str(ids),
            Arg::I64(now),
            Arg::I64(audit_id),
        ],
    )
    .await
}

fn json_list<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    serde_json::to_string(&ids.collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into())
}

/// The page's deliveries: purged, or moved (duplicates purged). Returns what it did and the
/// runs to promote again after COMMIT.
async fn deliveries<D: Dialect>(
    conn: &mut Conn<D>,
    audit_id: i64,
    op: &DestinationOperation,
    selected: &[(String, bool, String, String)],
    now: i64,
) -> Result<(DestinationPage, Vec<StreamKey>), StoreError> {
    let mut done = DestinationPage {
        selected: selected.len() as u64,
        ..DestinationPage::default()
    };
    let Some(to) = op.to.as_deref() else {
        let ids = json_list(selected.iter().map(|s| s.0.as_str()));
        done.dead_letters = purge_rows::<D>(conn, audit_id, &op.from, &ids, now).await?;
        done.deliveries = selected.iter().filter(|s| s.1).count() as u64;
        return Ok((done, Vec::new()));
    };
    // Events `to` has a delivery of already (in any status): delivering them again would
    // deliver twice.
    let all = json_list(selected.iter().map(|s| s.0.as_str()));
    let having = format!(
        "SELECT event_id FROM event_deliveries WHERE handler = $1 AND {}",
        D::text_in("event_id", "$2")
    );
    let duplicates: std::collections::HashSet<String> =
        rows::<D>(conn, &having, &[Arg::Str(to), Arg::Str(&all)])
            .await?
            .iter()
            .map(|r| D::DB::get_string(r, "event_id").map_err(db))
            .collect::<Result<_, _>>()?;
    if !duplicates.is_empty() {
        let ids = json_list(duplicates.iter().map(String::as_str));
        purge_rows::<D>(conn, audit_id, &op.from, &ids, now).await?;
        done.duplicates = duplicates.len() as u64;
    }
    let moving: Vec<&(String, bool, String, String)> = selected
        .iter()
        .filter(|s| !duplicates.contains(&s.0))
        .collect();
    if moving.is_empty() {
        return Ok((done, Vec::new()));
    }
    let ids = json_list(moving.iter().map(|s| s.0.as_str()));
    // Into `to`'s runs at the event's place in its aggregate (0, a run of its own, when `to`
    // is unordered), not ready until the heads are recomputed below; a pending delivery
    // starts afresh for its new destination, a dead one stays dead (its dead letter moves
    // with it and replays onto `to`).
    let sequence = if op.ordered {
        "COALESCE((SELECT o.sequence FROM event_outbox o WHERE o.event_id = event_deliveries.event_id), 0)"
    } else {
        "0"
    };
    let fresh = "CASE WHEN status = 'pending'";
    let moved = format!(
        "UPDATE event_deliveries SET handler = $3, sequence = {sequence}, lease_token = NULL, \
             ready = FALSE, \
             attempts = {fresh} THEN 0 ELSE attempts END, \
             next_attempt_at = {fresh} THEN $4 ELSE next_attempt_at END, \
             first_failed_at = {fresh} THEN NULL ELSE first_failed_at END, \
             last_failed_at = {fresh} THEN NULL ELSE last_failed_at END, \
             last_error = {fresh} THEN NULL ELSE last_error END \
         WHERE handler = $1 AND status IN ('pending', 'dead') AND {}",
        D::text_in("event_id", "$2")
    );
    execute::<D>(
        conn,
        &moved,
        &[
            Arg::Str(&op.from),
            Arg::Str(&ids),
            Arg::Str(to),
            Arg::I64(now),
        ],
    )
    .await?;
    let letters = format!(
        "UPDATE event_dead_letters SET handler = $3 \
         WHERE handler = $1 AND resolved_at IS NULL AND kind = 'delivery' AND {}",
        D::text_in("event_id", "$2")
    );
    done.dead_letters = execute::<D>(
        conn,
        &letters,
        &[Arg::Str(&op.from), Arg::Str(&ids), Arg::Str(to)],
    )
    .await?;
    done.deliveries = moving.iter().filter(|s| s.1).count() as u64;
    // Unordered deliveries are runs of their own: ready at once, never held for a
    // predecessor. The others' runs get their head recomputed.
    let unordered = format!(
        "UPDATE event_deliveries SET ready = TRUE, held = FALSE WHERE handler = $1 AND sequence = 0 AND {}",
        D::text_in("event_id", "$2")
    );
    execute::<D>(conn, &unordered, &[Arg::Str(to), Arg::Str(&ids)]).await?;
    let mut runs: Vec<StreamKey> = moving
        .iter()
        .map(|s| (to.to_owned(), s.2.clone(), s.3.clone()))
        .collect();
    runs.sort();
    runs.dedup();
    reset_ready::<D>(conn, &runs, now).await?;
    let again = unblock::<D>(conn, runs).await?;
    Ok((done, again))
}

/// Clears the ready flag of every pending delivery of `runs` that no live worker holds, so
/// that the promotion that follows leaves exactly one ready head per run: a delivery moved in
/// before a run's old head takes its place. (A delivery a live worker holds is left alone: it
/// is being delivered.)
pub(crate) async fn reset_ready<D: Dialect>(
    conn: &mut Conn<D>,
    runs: &[StreamKey],
    now: i64,
) -> Result<(), StoreError> {
    for chunk in runs.chunks(RUNS_PER_STATEMENT) {
        let mut args = vec![Arg::I64(now)];
        for (h, t, i) in chunk {
            args.extend([Arg::Str(h), Arg::Str(t), Arg::Str(i)]);
        }
        let sql = format!(
            "UPDATE event_deliveries SET ready = FALSE FROM (VALUES {}) AS k \
             WHERE event_deliveries.handler = k.column1 AND event_deliveries.aggregate_type = k.column2 \
               AND event_deliveries.aggregate_id = k.column3 AND event_deliveries.status = 'pending' \
               AND event_deliveries.sequence > 0 AND event_deliveries.ready \
               AND (event_deliveries.lease_token IS NULL OR NOT EXISTS (SELECT 1 FROM event_leases l \
                    WHERE l.token = event_deliveries.lease_token AND l.expires_at >= $1))",
            placeholders(chunk.len(), 3, 2)
        );
        execute::<D>(conn, &sql, &args).await?;
    }
    Ok(())
}

/// Open dead letters of `op.from` without a delivery row: purged, or moved (those whose event
/// `to` has a delivery of purged as duplicates).
async fn orphans<D: Dialect>(
    conn: &mut Conn<D>,
    audit_id: i64,
    op: &DestinationOperation,
    page: u32,
    now: i64,
) -> Result<DestinationPage, StoreError> {
    const OPEN: &str = "SELECT id FROM event_dead_letters
        WHERE handler = $1 AND resolved_at IS NULL AND kind = 'delivery'";
    let mut done = DestinationPage::default();
    let purge = format!(
        "UPDATE event_dead_letters SET resolved_at = $3, resolution = 'purged', audit_id = $4 \
         WHERE id IN ({OPEN} {{}} ORDER BY id LIMIT $2)"
    );
    let Some(to) = op.to.as_deref() else {
        let sql = purge.replace("{}", "");
        done.dead_letters = execute::<D>(
            conn,
            &sql,
            &[
                Arg::Str(&op.from),
                Arg::I64(i64::from(page)),
                Arg::I64(now),
                Arg::I64(audit_id),
            ],
        )
        .await?;
        done.selected = done.dead_letters;
        return Ok(done);
    };
    let duplicate = purge.replace(
        "{}",
        "AND EXISTS (SELECT 1 FROM event_deliveries d WHERE d.handler = $5 AND d.event_id = event_dead_letters.event_id)",
    );
    done.duplicates = execute::<D>(
        conn,
        &duplicate,
        &[
            Arg::Str(&op.from),
            Arg::I64(i64::from(page)),
            Arg::I64(now),
            Arg::I64(audit_id),
            Arg::Str(to),
        ],
    )
    .await?;
    let moved = format!(
        "UPDATE event_dead_letters SET handler = $3 WHERE id IN ({OPEN} ORDER BY id LIMIT $2)"
    );
    done.dead_letters = execute::<D>(
        conn,
        &moved,
        &[Arg::Str(&op.from), Arg::I64(i64::from(page)), Arg::Str(to)],
    )
    .await?;
    done.selected = done.duplicates + done.dead_letters;
    Ok(done)
}

/// The names of the events `destination` left undelivered: those of its pending deliveries
/// and open dead letters, sorted, each once.
pub(crate) async fn undelivered_event_names<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
) -> Result<Vec<String>, StoreError> {
    const SQL: &str = "SELECT DISTINCT o.name AS name FROM event_deliveries d \
         JOIN event_outbox o ON o.event_id = d.event_id \
         WHERE d.handler = $1 AND d.status IN ('pending', 'dead') ORDER BY o.name";
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(&mut conn, SQL, &[Arg::Str(destination)])
        .await?
        .iter()
        .map(|r| D::DB::get_string(r, "name").map_err(db))
        .collect()
}
