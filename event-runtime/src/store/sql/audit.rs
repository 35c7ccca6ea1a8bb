//! The audit log's rows: the one statement that appends a row (every audited operation —
//! replay, purge, pause, resume, inbox adopt, purge and re-target of a destination — writes
//! through it), naming its dead letters, and reading a row back.

use sqlx::Database;

use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::AuditStamp;
use crate::store::types::AuditEntry;
use crate::store::{from_ms, StoreError};

/// The columns of an [`AuditEntry`], as [`from_row`] reads them.
pub(crate) const COLUMNS: &str =
    "id, action, actor, reason, at, dead_letter_ids, count, selection, finished_at";

/// An audit row to append.
pub(crate) struct NewAudit<'a> {
    pub(crate) action: &'a str,
    /// Who, why and when (also the time it is finished at, when `finished`).
    pub(crate) stamp: AuditStamp<'a>,
    /// What an operation over a selection selected (JSON); `None` for one by id or one that
    /// names no dead letters.
    pub(crate) selection: Option<&'a str>,
    /// Finished at `stamp.at` (an operation done in one transaction), or left unfinished (one that
    /// runs page by page and is finished by its last page).
    pub(crate) finished: bool,
}

impl<'a> NewAudit<'a> {
    /// An operation done in one transaction, naming no selection: finished when stamped.
    pub(crate) fn finished(action: &'a str, stamp: AuditStamp<'a>) -> Self {
        NewAudit {
            action,
            stamp,
            selection: None,
            finished: true,
        }
    }
}

/// Appends `a` on `conn` (naming no dead letters, count 0) and returns it.
pub(crate) async fn insert<D: Dialect>(
    conn: &mut Conn<D>,
    a: &NewAudit<'_>,
) -> Result<AuditEntry, StoreError> {
    let sql = format!(
        "INSERT INTO event_audit_log (action, actor, reason, at, dead_letter_ids, count, selection, finished_at) \
         VALUES ($1, $2, $3, $4, '[]', 0, $5, $6) RETURNING {COLUMNS}"
    );
    rows::<D>(
        conn,
        &sql,
        &[
            Arg::Str(a.action),
            Arg::Str(a.stamp.actor),
            Arg::Str(a.stamp.reason),
            Arg::I64(a.stamp.at),
            Arg::OptStr(a.selection),
            Arg::OptI64(a.finished.then_some(a.stamp.at)),
        ],
    )
    .await?
    .first()
    .map(from_row::<D>)
    .transpose()?
    .ok_or_else(|| StoreError::Corrupt("the audit insert returned no row".into()))
}

/// Records in `entry` (and its row) the dead letters it acted on: their ids, and the count.
pub(crate) async fn name_dead_letters<D: Dialect>(
    conn: &mut Conn<D>,
    entry: &mut AuditEntry,
    ids: Vec<i64>,
) -> Result<(), StoreError> {
    const SQL: &str = "UPDATE event_audit_log SET dead_letter_ids = $1, count = $2 WHERE id = $3";
    let json = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into());
    execute::<D>(
        conn,
        SQL,
        &[
            Arg::Str(&json),
            Arg::I64(ids.len() as i64),
            Arg::I64(entry.id),
        ],
    )
    .await?;
    entry.count = ids.len() as u64;
    entry.dead_letter_ids = ids;
    Ok(())
}

/// Adds `n` to the count of audit row `audit_id` (an operation in pages, one page done).
pub(crate) async fn add_to_count<D: Dialect>(
    conn: &mut Conn<D>,
    audit_id: i64,
    n: u64,
) -> Result<(), StoreError> {
    execute::<D>(
        conn,
        "UPDATE event_audit_log SET count = count + $1 WHERE id = $2",
        &[Arg::I64(n as i64), Arg::I64(audit_id)],
    )
    .await?;
    Ok(())
}

/// An audit row read with [`COLUMNS`].
pub(crate) fn from_row<D: Dialect>(r: &<D::DB as Database>::Row) -> Result<AuditEntry, StoreError> {
    let ids = D::DB::get_string(r, "dead_letter_ids").map_err(db)?;
    Ok(AuditEntry {
        id: D::DB::get_i64(r, "id").map_err(db)?,
        action: D::DB::get_string(r, "action").map_err(db)?,
        actor: D::DB::get_string(r, "actor").map_err(db)?,
        reason: D::DB::get_string(r, "reason").map_err(db)?,
        at: from_ms(D::DB::get_i64(r, "at").map_err(db)?),
        dead_letter_ids: serde_json::from_str(&ids)
            .map_err(|e| StoreError::Corrupt(format!("audit dead_letter_ids: {e}")))?,
        count: D::DB::get_i64(r, "count").map_err(db)?.max(0) as u64,
        selection: D::DB::get_opt_string(r, "selection").map_err(db)?,
        finished_at: D::DB::get_opt_i64(r, "finished_at")
            .map_err(db)?
            .map(from_ms),
    })
}
