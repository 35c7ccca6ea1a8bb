//! Re-publishing what a relay published already, in pages: the relay's completed deliveries
//! of the selected events made pending again (same event ids), joined to their runs in
//! sequence order; and the sequences a relay published, which a delivery published again
//! after later ones names as its predecessor. Each page is one transaction that also counts
//! itself in the operation's audit row. Decides nothing about brokers: the relay publishes.

use sqlx::Pool;

use super::append::StreamKey;
use super::audit::{self, COLUMNS as AUDIT_COLUMNS};
use super::chain::i64_of;
use super::dead_letters::unblock;
use super::exec::{Arg, SqlExec};
use super::retarget::reset_ready;
use super::{commit_and_promote, db, execute, rows, Conn, Dialect};
use crate::store::backend::{AuditStamp, RepublishPage, RepublishSelection, RepublishStart};
use crate::store::StoreError;

/// The audit log's action of a re-publish.
pub(crate) const ACTION: &str = "relay-republish";

/// The `FROM … WHERE` of the selected events of `sel` with the delivery statuses `statuses`
/// (an SQL list), parameters from `$first` on (destination, since, then each aggregate's type
/// and id), and its arguments.
fn selected<'a>(
    sel: &'a RepublishSelection,
    statuses: &str,
    first: usize,
) -> (String, Vec<Arg<'a>>) {
    let mut args = vec![
        Arg::Str(&sel.destination),
        Arg::I64(sel.since_ms.unwrap_or(i64::MIN)),
    ];
    let mut sql = format!(
        "FROM event_outbox o JOIN event_deliveries d ON d.handler = ${} AND d.event_id = o.event_id \
         WHERE d.status IN ({statuses}) AND o.recorded_at >= ${}",
        first,
        first + 1
    );
    if !sel.aggregates.is_empty() {
        let mut n = first + 2;
        let any: Vec<String> = sel
            .aggregates
            .iter()
            .map(|(t, i)| {
                args.extend([Arg::Str(t), Arg::Str(i)]);
                n += 2;
                format!(
                    "(o.aggregate_type = ${} AND o.aggregate_id = ${})",
                    n - 2,
                    n - 1
                )
            })
            .collect();
        sql.push_str(&format!(" AND ({})", any.join(" OR ")));
    }
    (sql, args)
}

/// Refuses an empty selection; continues the unfinished re-publish of the same selection if
/// there is one, else writes a new audit row, unfinished; counts what is pending or dead.
pub(crate) async fn start<D: Dialect>(
    pool: &Pool<D::DB>,
    sel: &RepublishSelection,
    stamp: &AuditStamp<'_>,
) -> Result<RepublishStart, StoreError> {
    if sel.aggregates.is_empty() && sel.since_ms.is_none() {
        return Err(StoreError::InvalidSelection(
            "a re-publish names aggregates or a time to start from".into(),
        ));
    }
    let json =
        serde_json::to_string(sel).map_err(|e| StoreError::Corrupt(format!("selection: {e}")))?;
    let mut tx = D::begin(pool).await.map_err(db)?;
    let unfinished = format!(
        "SELECT {AUDIT_COLUMNS} FROM event_audit_log \
         WHERE action = $1 AND selection = $2 AND finished_at IS NULL ORDER BY id DESC LIMIT 1"
    );
    let found = rows::<D>(&mut tx, &unfinished, &[Arg::Str(ACTION), Arg::Str(&json)])
        .await?
        .first()
        .map(audit::from_row::<D>)
        .transpose()?;
    let audit = match found {
        Some(a) => a,
        None => super::resolution::insert_audit::<D>(&mut tx, ACTION, stamp, &json).await?,
    };
    let (from, args) = selected(sel, "'pending', 'dead'", 1);
    let counts = rows::<D>(
        &mut tx,
        &format!("SELECT d.status AS status, COUNT(*) AS n {from} GROUP BY d.status"),
        &args,
    )
    .await?;
    let (mut pending, mut dead) = (0, 0);
    for r in &counts {
        let n = D::DB::get_i64(r, "n").map_err(db)?.max(0) as u64;
        match D::DB::get_string(r, "status").map_err(db)?.as_str() {
            "pending" => pending = n,
            _ => dead = n,
        }
    }
    tx.commit().await.map_err(db)?;
    Ok(RepublishStart {
        audit,
        pending,
        dead,
    })
}

/// One page: at most `page` selected events after `after` (event id order) whose delivery
/// completed at or before `started`, made pending again and joined to their runs.
pub(crate) async fn page<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
    sel: &RepublishSelection,
    started: i64,
    after: &str,
    page: u32,
    now: i64,
) -> Result<RepublishPage, StoreError> {
    let (from, mut args) = selected(sel, "'completed'", 4);
    let sql = format!(
        "SELECT o.event_id AS event_id, d.aggregate_type AS aggregate_type, \
                d.aggregate_id AS aggregate_id, d.sequence AS sequence \
         {from} AND d.completed_at <= $1 AND o.event_id > $2 ORDER BY o.event_id LIMIT $3"
    );
    let mut all = vec![
        Arg::I64(started),
        Arg::Str(after),
        Arg::I64(i64::from(page)),
    ];
    all.append(&mut args);
    let mut tx = D::begin(pool).await.map_err(db)?;
    let found = rows::<D>(&mut tx, &sql, &all).await?;
    let mut ids = Vec::with_capacity(found.len());
    let mut runs: Vec<StreamKey> = Vec::new();
    for r in &found {
        ids.push(D::DB::get_string(r, "event_id").map_err(db)?);
        if D::DB::get_i64(r, "sequence").map_err(db)? > 0 {
            runs.push((
                sel.destination.clone(),
                D::DB::get_string(r, "aggregate_type").map_err(db)?,
                D::DB::get_string(r, "aggregate_id").map_err(db)?,
            ));
        }
    }
    let Some(last) = ids.last().cloned() else {
        tx.commit().await.map_err(db)?;
        return Ok(RepublishPage::default());
    };
    let list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into());
    let again = republish::<D>(&mut tx, &sel.destination, &list, runs, now).await?;
    let republished = ids.len() as u64;
    audit::add_to_count::<D>(&mut tx, audit_id, republished).await?;
    commit_and_promote::<D>(tx, pool, &again).await?;
    Ok(RepublishPage {
        republished,
        last: Some(last),
    })
}

/// Makes the completed deliveries `ids` (a JSON list) of `destination` pending again, not
/// ready (an unordered one ready at once), then recomputes the heads of `runs`. Returns the
/// runs to promote again after COMMIT where the dialect needs it.
async fn republish<D: Dialect>(
    conn: &mut Conn<D>,
    destination: &str,
    ids: &str,
    mut runs: Vec<StreamKey>,
    now: i64,
) -> Result<Vec<StreamKey>, StoreError> {
    let sql = format!(
        "UPDATE event_deliveries SET status = 'pending', attempts = 0, next_attempt_at = $3, \
             ready = (sequence = 0), held = FALSE, lease_token = NULL, first_failed_at = NULL, \
             last_failed_at = NULL, last_error = NULL, completed_at = NULL \
         WHERE handler = $1 AND status = 'completed' AND {}",
        D::text_in("event_id", "$2")
    );
    execute::<D>(
        conn,
        &sql,
        &[Arg::Str(destination), Arg::Str(ids), Arg::I64(now)],
    )
    .await?;
    runs.sort();
    runs.dedup();
    reset_ready::<D>(conn, &runs, now).await?;
    unblock::<D>(conn, runs).await
}

/// The sequences of `aggregate`'s events whose delivery to `destination` completed, below
/// `below`, highest first, at most `limit`.
pub(crate) async fn published_sequences<D: Dialect>(
    pool: &Pool<D::DB>,
    destination: &str,
    (aggregate_type, aggregate_id): (&str, &str),
    below: u64,
    limit: usize,
) -> Result<Vec<u64>, StoreError> {
    // Through the outbox's (aggregate, sequence) index, then the delivery's primary key.
    const SQL: &str = "SELECT o.sequence AS sequence FROM event_outbox o \
         JOIN event_deliveries d ON d.handler = $1 AND d.event_id = o.event_id \
         WHERE o.aggregate_type = $2 AND o.aggregate_id = $3 AND o.sequence > 0 AND o.sequence < $4 \
           AND d.status = 'completed' \
         ORDER BY o.sequence DESC LIMIT $5";
    let mut conn = pool.acquire().await.map_err(db)?;
    rows::<D>(
        &mut conn,
        SQL,
        &[
            Arg::Str(destination),
            Arg::Str(aggregate_type),
            Arg::Str(aggregate_id),
            Arg::I64(i64_of(below)),
            Arg::I64(i64::try_from(limit).unwrap_or(i64::MAX)),
        ],
    )
    .await?
    .iter()
    .map(|r| Ok(D::DB::get_i64(r, "sequence").map_err(db)?.max(0) as u64))
    .collect()
}

/// Adds `n` to the count of audit row `audit_id`.
pub(crate) async fn add_to_audit_count<D: Dialect>(
    pool: &Pool<D::DB>,
    audit_id: i64,
    n: u64,
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    audit::add_to_count::<D>(&mut conn, audit_id, n).await
}
