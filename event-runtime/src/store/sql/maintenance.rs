//! Upkeep and inspection of the SQL store: the retention purge, backlog statistics, and the
//! check that a database holds an outbox. Changes no delivery's outcome.

use sqlx::Pool;

use super::exec::{Arg, SqlExec};
use super::{count, db, execute, rows, Conn, Dialect, MIGRATIONS_TABLE};
use crate::store::backend::PurgeStep;
use crate::store::types::{Backlog, DestinationBacklog, HandlerStats, OutboxStats};
use crate::store::StoreError;

pub(crate) async fn has_outbox<D: Dialect>(pool: &Pool<D::DB>) -> Result<bool, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    match rows::<D>(&mut conn, "SELECT 1 FROM event_outbox LIMIT 1", &[]).await {
        Ok(_) => Ok(true),
        // Only "no such table" means there is no outbox; a permission error or a lost
        // connection is passed through as it is.
        Err(StoreError::Database(e))
            if e.to_string().contains("no such table") || e.code() == Some("42P01") =>
        {
            D::why_no_outbox(pool).await.map_err(db)?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

pub(crate) async fn purge_completed<D: Dialect>(
    pool: &Pool<D::DB>,
    cutoff: i64,
    batch: u32,
) -> Result<PurgeStep, StoreError> {
    const DELIVERIES: &str = "DELETE FROM event_deliveries WHERE (handler, event_id) IN (
            SELECT handler, event_id FROM event_deliveries
            WHERE status = 'completed' AND completed_at < $1 LIMIT $2)";
    const OUTBOX: &str = "DELETE FROM event_outbox WHERE event_id IN (
            SELECT o.event_id FROM event_outbox o
            WHERE o.recorded_at < $1
              AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.event_id = o.event_id)
              AND NOT EXISTS (SELECT 1 FROM event_dead_letters l WHERE l.event_id = o.event_id AND l.resolved_at IS NULL)
            LIMIT $2)";
    let mut tx = D::begin(pool).await.map_err(db)?;
    if !D::lock_purger(&mut tx).await.map_err(db)? {
        return Ok(PurgeStep {
            busy: true,
            ..PurgeStep::default()
        });
    }
    let args = [Arg::I64(cutoff), Arg::I64(i64::from(batch))];
    let deliveries = execute::<D>(&mut tx, DELIVERIES, &args).await?;
    let events = execute::<D>(&mut tx, OUTBOX, &args).await?;
    tx.commit().await.map_err(db)?;
    Ok(PurgeStep {
        deliveries,
        events,
        busy: false,
    })
}

/// Open dead letters (the partial index `event_dead_letters_open`).
const OPEN_DEAD_LETTERS: &str =
    "SELECT COUNT(*) AS n FROM event_dead_letters WHERE resolved_at IS NULL";

/// Held received events: read through the partial index `event_inbox_chain_held`.
const HELD: &str = "SELECT COUNT(*) AS n FROM event_inbox_chain WHERE state = 'held'";

const OPEN_GAPS: &str = "SELECT COUNT(*) AS n FROM event_inbox_gaps WHERE closed_at IS NULL";

/// The destinations paused at `now`.
async fn paused<D: Dialect>(
    conn: &mut super::Conn<D>,
    now: i64,
) -> Result<Vec<String>, StoreError> {
    const PAUSED: &str = "SELECT DISTINCT destination FROM event_paused_destinations
        WHERE expires_at IS NULL OR expires_at > $1";
    rows::<D>(conn, PAUSED, &[Arg::I64(now)])
        .await?
        .iter()
        .map(|r| D::DB::get_string(r, "destination").map_err(db))
        .collect()
}

/// The workers' gauges: pending deliveries per destination read through the partial index
/// of pending and dead deliveries (`event_deliveries_aggregate`), so the cost follows the
/// backlog, never the completed history.
pub(crate) async fn backlog<D: Dialect>(
    pool: &Pool<D::DB>,
    now: i64,
) -> Result<Backlog, StoreError> {
    // `status IN (…)` repeats the index's predicate word for word: SQLite uses a partial
    // index only for a query whose WHERE contains its predicate's terms.
    const PENDING: &str = "SELECT handler, COUNT(*) AS n, MIN(created_at) AS oldest
        FROM event_deliveries
        WHERE status IN ('pending', 'dead') AND status = 'pending'
        GROUP BY handler ORDER BY handler";
    let mut conn = pool.acquire().await.map_err(db)?;
    let mut destinations = Vec::new();
    for r in rows::<D>(&mut conn, PENDING, &[]).await? {
        // A creation time of another type (SQLite keeps any) has no age; `stats` counts
        // such a row as unreadable.
        let oldest = D::DB::get_opt_i64(&r, "oldest")
            .ok()
            .flatten()
            .unwrap_or(now);
        destinations.push(DestinationBacklog {
            destination: D::DB::get_string(&r, "handler").map_err(db)?,
            pending: D::DB::get_i64(&r, "n").map_err(db)?.max(0) as u64,
            oldest_pending_age_secs: ((now - oldest).max(0) as f64) / 1000.0,
        });
    }
    Ok(Backlog {
        destinations,
        dead_letters: count::<D>(&mut conn, OPEN_DEAD_LETTERS, &[]).await?,
        paused: paused::<D>(&mut conn, now).await?,
        held: count::<D>(&mut conn, HELD, &[]).await?,
        open_gaps: count::<D>(&mut conn, OPEN_GAPS, &[]).await?,
    })
}

pub(crate) async fn stats<D: Dialect>(
    pool: &Pool<D::DB>,
    now: i64,
) -> Result<OutboxStats, StoreError> {
    const PER_HANDLER: &str = "SELECT handler, status, COUNT(*) AS n, MIN(created_at) AS oldest
        FROM event_deliveries GROUP BY handler, status ORDER BY handler, status";
    const EVENTS: &str = "SELECT COUNT(*) AS n FROM event_outbox";
    // Pending deliveries behind a dead head: found from the dead heads (few), each extended
    // over its run, rather than by asking of every pending delivery whether a dead one
    // precedes it (quadratic in a long run).
    const BLOCKED: &str = "SELECT COUNT(*) AS n FROM event_deliveries h JOIN event_deliveries d
          ON d.handler = h.handler AND d.aggregate_type = h.aggregate_type
         AND d.aggregate_id = h.aggregate_id AND d.sequence > h.sequence
        WHERE h.status IN ('pending', 'dead') AND h.status = 'dead' AND h.sequence > 0
          AND d.status IN ('pending', 'dead') AND d.status = 'pending'";
    // Pending deliveries the engine cannot read, per handler.
    let unreadable = format!(
        "SELECT d.handler, COUNT(*) AS n FROM event_deliveries d WHERE d.status = 'pending' AND \
         (d.sequence < 0 OR NOT EXISTS (SELECT 1 FROM event_outbox o WHERE o.event_id = d.event_id) \
          OR {}) GROUP BY d.handler",
        D::UNREADABLE_DELIVERY
    );
    let mut conn = pool.acquire().await.map_err(db)?;
    let mut stats = OutboxStats {
        events: count::<D>(&mut conn, EVENTS, &[]).await?,
        dead_letters: count::<D>(&mut conn, OPEN_DEAD_LETTERS, &[]).await?,
        blocked: count::<D>(&mut conn, BLOCKED, &[]).await?,
        ..OutboxStats::default()
    };
    let paused = paused::<D>(&mut conn, now).await?;
    let mut oldest: Option<i64> = None;
    for r in rows::<D>(&mut conn, PER_HANDLER, &[]).await? {
        let handler = D::DB::get_string(&r, "handler").map_err(db)?;
        let status = D::DB::get_string(&r, "status").map_err(db)?;
        let n = D::DB::get_i64(&r, "n").map_err(db)?.max(0) as u64;
        // A creation time of another type (SQLite keeps any) has no age: the row is counted
        // as unreadable below instead of failing the statistics that say so.
        let first = D::DB::get_opt_i64(&r, "oldest").ok().flatten();
        let entry = match stats.handlers.iter_mut().position(|h| h.handler == handler) {
            Some(i) => &mut stats.handlers[i],
            None => {
                stats.handlers.push(HandlerStats {
                    paused: paused.contains(&handler),
                    handler,
                    ..HandlerStats::default()
                });
                stats.handlers.last_mut().expect("just pushed")
            }
        };
        match status.as_str() {
            "pending" => {
                entry.pending += n;
                stats.pending += n;
                if let Some(f) = first {
                    oldest = Some(oldest.map_or(f, |o| o.min(f)));
                }
            }
            "completed" => entry.completed += n,
            "dead" => entry.dead += n,
            "purged" => entry.purged += n,
            _ => {
                entry.unknown += n;
                stats.unknown_status += n;
            }
        }
    }
    for r in rows::<D>(&mut conn, &unreadable, &[]).await? {
        let handler = D::DB::get_string(&r, "handler").map_err(db)?;
        let n = D::DB::get_i64(&r, "n").map_err(db)?.max(0) as u64;
        stats.unreadable += n;
        if let Some(h) = stats.handlers.iter_mut().find(|h| h.handler == handler) {
            h.unreadable += n;
        }
    }
    for p in paused {
        if !stats.handlers.iter().any(|h| h.handler == p) {
            stats.handlers.push(HandlerStats {
                handler: p,
                paused: true,
                ..HandlerStats::default()
            });
        }
    }
    stats.oldest_pending_age_secs = oldest.map(|o| ((now - o).max(0) as f64) / 1000.0);
    Ok(stats)
}

/// Moves the rows of the outbox's migrations `versions` from sqlx's default table
/// `_sqlx_migrations` (where release 0.1.0 recorded them) into [`MIGRATIONS_TABLE`], on `tx`
/// (a transaction the caller began and commits). Nothing when that table does not exist.
pub(crate) async fn adopt_migrations<D: Dialect>(
    tx: &mut Conn<D>,
    versions: &[i64],
) -> Result<(), StoreError> {
    if rows::<D>(tx, D::OLD_MIGRATIONS_TABLE, &[])
        .await?
        .is_empty()
    {
        return Ok(());
    }
    // The versions as texts, compared with the column cast to text: the same on every
    // dialect, whatever type its JSON functions give a number.
    let texts: Vec<String> = versions.iter().map(i64::to_string).collect();
    let list = serde_json::to_string(&texts).unwrap_or_else(|_| "[]".into());
    let listed = D::text_in("CAST(version AS TEXT)", "$1");
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} {}",
        D::MIGRATIONS_COLUMNS
    );
    execute::<D>(tx, &create, &[]).await?;
    let copy = format!(
        "INSERT INTO {MIGRATIONS_TABLE} SELECT * FROM _sqlx_migrations WHERE {listed} \
         ON CONFLICT (version) DO NOTHING"
    );
    execute::<D>(tx, &copy, &[Arg::Str(&list)]).await?;
    let delete = format!("DELETE FROM _sqlx_migrations WHERE {listed}");
    execute::<D>(tx, &delete, &[Arg::Str(&list)]).await?;
    Ok(())
}
