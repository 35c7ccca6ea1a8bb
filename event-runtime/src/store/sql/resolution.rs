//! Replay and purge over a selection, in pages: the operation's audit row is written first
//! (with what it selects and the newest dead letter it may touch), then each page of ids — ids
//! only, never envelopes — is resolved in a transaction of its own that also adds to the audit
//! row's count, and the row is marked finished at the end. Memory stays one page whatever the
//! count, SQLite's write lock is released between pages, and an interrupted operation resumes
//! from its audit row (what it resolved is no longer open, so the next page starts after it).

use sqlx::Pool;

use super::audit::{self, NewAudit, COLUMNS as AUDIT_COLUMNS};
use super::dead_letters::{action_name, unblock};
use super::exec::{Arg, SqlExec};
use super::{commit_and_promote, db, execute, rows, Conn, Dialect};
use crate::store::backend::{
    AuditStamp, ResolutionOperation, ResolutionSelection, ResolutionStart, ResolvedPage,
};
use crate::store::types::{AuditEntry, DeadLetterFilter, Resolution};
use crate::store::StoreError;

pub(crate) async fn start<D: Dialect>(
    pool: &Pool<D::DB>,
    filter: &DeadLetterFilter,
    action: Resolution,
    stamp: &AuditStamp<'_>,
) -> Result<ResolutionStart, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    const NEWEST: &str = "SELECT COALESCE(MAX(id), 0) AS n FROM event_dead_letters";
    let newest = super::count::<D>(&mut tx, NEWEST, &[]).await? as i64;
    let selection = ResolutionSelection {
        id: filter.id,
        handler: filter.handler.clone(),
        event_name: filter.event_name.clone(),
        since_ms: filter.since.map(|t| t.timestamp_millis()),
        until_ms: filter.until.map(|t| t.timestamp_millis()),
        limit: filter.limit.map(u64::from),
        up_to_id: newest,
    };
    let json = serde_json::to_string(&selection)
        .map_err(|e| StoreError::Corrupt(format!("selection: {e}")))?;
    let entry = insert_audit::<D>(&mut tx, action_name(action), stamp, &json).await?;
    tx.commit().await.map_err(db)?;
    Ok(ResolutionStart { entry, selection })
}

/// Writes the audit row of an operation over a selection (`selection`, JSON), unfinished,
/// counted up page by page from 0, and returns it.
pub(crate) async fn insert_audit<D: Dialect>(
    conn: &mut Conn<D>,
    action: &str,
    stamp: &AuditStamp<'_>,
    selection: &str,
) -> Result<AuditEntry, StoreError> {
    let a = NewAudit {
        action,
        stamp: *stamp,
        selection: Some(selection),
        finished: false,
    };
    audit::insert::<D>(conn, &a).await
}

/// Resolves the next page of at most `page` open dead letters of `selection`. Returns how
/// many it selected (fewer than `page`: the operation is done) and how many it resolved.
pub(crate) async fn page<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
    action: Resolution,
    selection: &ResolutionSelection,
    page: u32,
    now: i64,
) -> Result<ResolvedPage, StoreError> {
    // The page: marked resolved in one statement, ids only (never the envelopes).
    // An inbox's dead letter has no delivery to replay: its inbox replays it (it decodes).
    const MARK: &str =
        "UPDATE event_dead_letters SET resolved_at = $8, resolution = $9, audit_id = $10
        WHERE resolved_at IS NULL AND id IN (SELECT id FROM event_dead_letters
          WHERE resolved_at IS NULL AND id <= $1 AND ($9 = 'purged' OR kind = 'delivery')
            AND ($2 IS NULL OR handler = $2)
            AND ($3 IS NULL OR name = $3)
            AND ($4 IS NULL OR dead_at >= $4)
            AND ($5 IS NULL OR dead_at < $5)
            AND ($6 IS NULL OR id = $6)
          ORDER BY id LIMIT $7)
        RETURNING handler, event_id";
    let (label, set) = match action {
        // A replayed delivery is the head of its run again (it was when it died).
        Resolution::Replay => (
            "replayed",
            "status = 'pending', attempts = 0, next_attempt_at = $1, lease_token = NULL, ready = TRUE, \
             last_error = NULL, first_failed_at = NULL, last_failed_at = NULL",
        ),
        // (`$1`, the time, is bound to both statements; a purge has no use for it.)
        Resolution::Purge => (
            "purged",
            "status = 'purged', lease_token = NULL, attempts = attempts + 0 * $1",
        ),
    };
    let deliveries = format!(
        "UPDATE event_deliveries SET {set} WHERE handler = $2 AND status = 'dead' AND {} \
         RETURNING aggregate_type, aggregate_id",
        D::text_in("event_id", "$3")
    );
    let mut tx = D::begin(pool).await.map_err(db)?;
    let marked: Vec<(String, String)> = rows::<D>(
        &mut tx,
        MARK,
        &[
            Arg::I64(selection.up_to_id),
            Arg::OptStr(selection.handler.as_deref()),
            Arg::OptStr(selection.event_name.as_deref()),
            Arg::OptI64(selection.since_ms),
            Arg::OptI64(selection.until_ms),
            Arg::OptI64(selection.id),
            Arg::I64(i64::from(page)),
            Arg::I64(now),
            Arg::Str(label),
            Arg::I64(audit_id),
        ],
    )
    .await?
    .iter()
    .map(|r| {
        Ok((
            D::DB::get_string(r, "handler").map_err(db)?,
            D::DB::get_string(r, "event_id").map_err(db)?,
        ))
    })
    .collect::<Result<_, StoreError>>()?;
    let mut streams = Vec::new();
    let keys = marked.iter().map(|(h, e)| (h.as_str(), e.as_str()));
    for (destination, list) in super::by_destination(keys) {
        for r in rows::<D>(
            &mut tx,
            &deliveries,
            &[Arg::I64(now), Arg::Str(destination), Arg::Str(&list)],
        )
        .await?
        {
            if action == Resolution::Purge {
                streams.push((
                    destination.to_owned(),
                    D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_id").map_err(db)?,
                ));
            }
        }
    }
    if action == Resolution::Purge {
        // A purged inbox dead letter that held the events after it in its aggregate's chain
        // accepts the gap it leaves: they are released.
        let ids: Vec<String> = marked.iter().map(|(_, e)| e.clone()).collect();
        streams.extend(super::gaps::skip_dead_places::<D>(&mut tx, &ids, now).await?);
    }
    let resolved = marked.len() as u64;
    // A purge lets the next delivery of each run flow.
    let again = unblock::<D>(&mut tx, streams).await?;
    super::audit::add_to_count::<D>(&mut tx, audit_id, resolved).await?;
    commit_and_promote::<D>(tx, pool, &again).await?;
    // Every selected letter was open (the statement marks and selects at once).
    Ok(ResolvedPage {
        selected: resolved,
        resolved,
    })
}

pub(crate) async fn finish<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
    now: i64,
) -> Result<AuditEntry, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    execute::<D>(
        &mut conn,
        "UPDATE event_audit_log SET finished_at = $1 WHERE id = $2",
        &[Arg::I64(now), Arg::I64(audit_id)],
    )
    .await?;
    // Any audit row of an operation in pages (a resolution, a handler's purge or re-target).
    let sql = format!("SELECT {AUDIT_COLUMNS} FROM event_audit_log WHERE id = $1");
    rows::<D>(&mut conn, &sql, &[Arg::I64(audit_id)])
        .await?
        .first()
        .map(audit::from_row::<D>)
        .transpose()?
        .ok_or_else(|| StoreError::Corrupt(format!("audit row {audit_id} disappeared")))
}

/// An operation over a selection by its audit id: its row, action and selection; `None` when
/// no such row exists or it was not an operation over a selection.
pub(crate) async fn load<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
) -> Result<Option<ResolutionOperation>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let sql = format!("SELECT {AUDIT_COLUMNS} FROM event_audit_log WHERE id = $1");
    let Some(entry) = rows::<D>(&mut conn, &sql, &[Arg::I64(audit_id)])
        .await?
        .first()
        .map(audit::from_row::<D>)
        .transpose()?
    else {
        return Ok(None);
    };
    let action = match entry.action.as_str() {
        "replay" => Resolution::Replay,
        "purge" => Resolution::Purge,
        _ => return Ok(None),
    };
    let Some(json) = entry.selection.as_deref() else {
        return Ok(None);
    };
    let selection: ResolutionSelection = serde_json::from_str(json)
        .map_err(|e| StoreError::Corrupt(format!("audit row {audit_id} selection: {e}")))?;
    Ok(Some(ResolutionOperation {
        entry,
        action,
        selection,
    }))
}
