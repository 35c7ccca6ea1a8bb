//! The write side of a commit: outbox rows, delivery rows, and the promotion that makes the
//! head of each run ready. Runs inside the caller's transaction; never commits.

use std::collections::{HashMap, HashSet};

use sqlx::Pool;
use uuid::Uuid;

use super::exec::{placeholders, Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::{NewEvent, PlaceQuery};
use crate::store::StoreError;

/// Statements write at most this many rows each (parameter limits: SQLite allows 32,766
/// parameters, PostgreSQL 65,535).
const CHUNK: usize = 200;

/// A run: (destination, aggregate type, aggregate id).
pub(crate) type StreamKey = (String, String, String);

fn seq(e: &NewEvent) -> Result<i64, StoreError> {
    i64::try_from(e.sequence).map_err(|_| StoreError::SequenceOutOfRange {
        aggregate_type: e.aggregate_type.clone(),
        aggregate_id: e.aggregate_id.clone(),
        sequence: e.sequence,
    })
}

/// Inserts outbox rows and returns the ids that were new (an id already present is skipped:
/// appending is idempotent). On PostgreSQL a concurrent transaction inserting the same id
/// makes this one wait for it, then skip.
pub(crate) async fn append_events<D: Dialect>(
    conn: &mut Conn<D>,
    pool: &Pool<D::DB>,
    events: &[NewEvent],
    now: i64,
) -> Result<HashSet<Uuid>, StoreError> {
    let mut sequences = Vec::with_capacity(events.len());
    let mut seen: HashMap<(&str, &str, i64), ()> = HashMap::new();
    for e in events {
        let s = seq(e)?;
        if s > 0
            && seen
                .insert((&e.aggregate_type, &e.aggregate_id, s), ())
                .is_some()
        {
            // Two events of one commit claim the same place in their aggregate's stream.
            return Err(StoreError::Conflict {
                aggregate_type: e.aggregate_type.clone(),
                aggregate_id: e.aggregate_id.clone(),
                sequence: e.sequence,
            });
        }
        sequences.push(s);
    }
    let mut inserted = HashSet::with_capacity(events.len());
    for (chunk, seqs) in events.chunks(CHUNK).zip(sequences.chunks(CHUNK)) {
        let ids: Vec<String> = chunk.iter().map(|e| e.event_id.to_string()).collect();
        let versions: Vec<i64> = chunk.iter().map(|e| i64::from(e.version)).collect();
        let mut args = Vec::with_capacity(chunk.len() * 10);
        for (i, e) in chunk.iter().enumerate() {
            args.extend([
                Arg::Str(&ids[i]),
                Arg::Str(&e.name),
                Arg::I64(versions[i]),
                Arg::Str(&e.aggregate_type),
                Arg::Str(&e.aggregate_id),
                Arg::I64(seqs[i]),
                Arg::I64(e.occurred_at),
                Arg::I64(now),
                Arg::Str(&e.envelope),
                Arg::OptStr(e.origin.as_deref()),
            ]);
        }
        let sql = format!(
            "INSERT INTO event_outbox (event_id, name, version, aggregate_type, aggregate_id, sequence, occurred_at, recorded_at, envelope, origin) VALUES {} ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
            placeholders(chunk.len(), 10, 1)
        );
        match D::DB::rows(conn, &sql, &args).await {
            Ok(rows) => {
                for r in &rows {
                    let id = D::DB::get_string(r, "event_id").map_err(db)?;
                    inserted.insert(Uuid::parse_str(&id).map_err(|e| {
                        StoreError::Corrupt(format!("event_outbox.event_id {id:?}: {e}"))
                    })?);
                }
            }
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                // The event_id conflict is absorbed by ON CONFLICT; what is left is the
                // (aggregate, sequence) index. The transaction may be aborted (PostgreSQL):
                // look the committed row up outside it.
                return Err(conflicting_row::<D>(pool, chunk, seqs).await);
            }
            Err(e) => return Err(db(e)),
        }
    }
    Ok(inserted)
}

/// The row of `chunk` whose (aggregate, sequence) another commit already recorded.
async fn conflicting_row<D: Dialect>(
    pool: &Pool<D::DB>,
    chunk: &[NewEvent],
    seqs: &[i64],
) -> StoreError {
    let fallback = || {
        let e = &chunk[0];
        StoreError::Conflict {
            aggregate_type: e.aggregate_type.clone(),
            aggregate_id: e.aggregate_id.clone(),
            sequence: e.sequence,
        }
    };
    let Ok(mut conn) = pool.acquire().await else {
        return fallback();
    };
    for (e, &s) in chunk.iter().zip(seqs) {
        if s == 0 {
            continue;
        }
        let id = e.event_id.to_string();
        let found = rows::<D>(
            &mut conn,
            "SELECT event_id FROM event_outbox WHERE aggregate_type = $1 AND aggregate_id = $2 AND sequence = $3 AND event_id <> $4",
            &[Arg::Str(&e.aggregate_type), Arg::Str(&e.aggregate_id), Arg::I64(s), Arg::Str(&id)],
        )
        .await;
        if matches!(found, Ok(r) if !r.is_empty()) {
            return StoreError::Conflict {
                aggregate_type: e.aggregate_type.clone(),
                aggregate_id: e.aggregate_id.clone(),
                sequence: e.sequence,
            };
        }
    }
    fallback()
}

/// Inserts one delivery row per (event, route) of `events`, due at `now`. An unordered route
/// or an unsequenced event is its own run, ready at once; for the others the head of each
/// run is made ready, unless it is a delivery of an event in `held` (a received event whose
/// predecessor was not released: part of its run, never ready until released). Returns the runs that found an earlier delivery pending (to promote
/// again after COMMIT, where the dialect needs it).
pub(crate) async fn insert_deliveries<D: Dialect>(
    conn: &mut Conn<D>,
    events: &[&NewEvent],
    held: &HashSet<Uuid>,
    now: i64,
) -> Result<Vec<StreamKey>, StoreError> {
    struct Row<'a> {
        destination: &'a str,
        event_id: String,
        event: &'a NewEvent,
        sequence: i64,
    }
    let mut deliveries = Vec::new();
    let mut streams: Vec<StreamKey> = Vec::new();
    let mut seen_streams = HashSet::new();
    for e in events {
        let s = seq(e)?;
        for route in &e.routes {
            let sequence = if route.ordered { s } else { 0 };
            if sequence > 0 {
                let key = (
                    route.destination.clone(),
                    e.aggregate_type.clone(),
                    e.aggregate_id.clone(),
                );
                if seen_streams.insert(key.clone()) {
                    streams.push(key);
                }
            }
            deliveries.push(Row {
                destination: &route.destination,
                event_id: e.event_id.to_string(),
                event: e,
                sequence,
            });
        }
    }
    for chunk in deliveries.chunks(CHUNK) {
        let mut args = Vec::with_capacity(chunk.len() * 9);
        for d in chunk {
            args.extend([
                Arg::Str(d.destination),
                Arg::Str(&d.event_id),
                Arg::Str(&d.event.aggregate_type),
                Arg::Str(&d.event.aggregate_id),
                Arg::I64(d.sequence),
                Arg::I64(now),
                Arg::I64(now),
                // Sequence 0 is never held back by, nor holds back, another delivery.
                Arg::Bool(d.sequence == 0),
                Arg::Bool(d.sequence > 0 && held.contains(&d.event.event_id)),
            ]);
        }
        let sql = format!(
            "INSERT INTO event_deliveries (handler, event_id, aggregate_type, aggregate_id, sequence, next_attempt_at, created_at, ready, held) VALUES {} ON CONFLICT (handler, event_id) DO NOTHING",
            placeholders(chunk.len(), 9, 1)
        );
        execute::<D>(conn, &sql, &args).await?;
    }
    let heads = promote::<D>(conn, &streams).await?;
    // A run whose head is an earlier delivery (pending before this commit) may see that head
    // completed by a worker whose own promotion cannot see this commit's rows yet: such runs
    // are promoted again after COMMIT, where the dialect needs it.
    let own: HashSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    Ok(streams
        .into_iter()
        .filter(|s| !heads.get(s).is_some_and(|id| own.contains(id.as_str())))
        .collect())
}

/// Makes ready the earliest pending delivery of each run in `streams`, unless an earlier one
/// of the run is dead (the run waits for its replay or purge) or it is held (its event waits
/// for its predecessor: see `chain`). Returns the runs whose head this
/// call made ready, with the head's event id (not those whose head was ready already).
pub(crate) async fn promote<D: Dialect>(
    conn: &mut Conn<D>,
    streams: &[StreamKey],
) -> Result<HashMap<StreamKey, String>, StoreError> {
    let mut ready = HashMap::new();
    for chunk in streams.chunks(CHUNK) {
        let mut args = Vec::with_capacity(chunk.len() * 3);
        for (h, t, i) in chunk {
            args.extend([Arg::Str(h), Arg::Str(t), Arg::Str(i)]);
        }
        // The head is the delivery with the lowest sequence among those pending or dead; a
        // run whose head is dead stays blocked (marking a dead head ready changes nothing:
        // a replay makes it ready anyway). The row is found by its primary key alone, so
        // that no planner reads the run's backlog to find it, whatever its statistics say. A
        // head that is ready already is left alone: it may be locked by the batch delivering
        // it, and a commit must never wait for a delivery batch.
        let sql = format!(
            "UPDATE event_deliveries SET ready = TRUE \
             FROM (SELECT k.column1 AS h, (SELECT p.event_id FROM event_deliveries p \
                     WHERE p.handler = k.column1 AND p.aggregate_type = k.column2 \
                       AND p.aggregate_id = k.column3 AND p.status IN ('pending', 'dead') \
                       AND p.sequence > 0 ORDER BY p.sequence LIMIT 1) AS e \
                   FROM (VALUES {}) AS k) AS n \
             WHERE event_deliveries.handler = n.h AND event_deliveries.event_id = n.e \
               AND NOT event_deliveries.ready AND NOT event_deliveries.held \
             RETURNING event_deliveries.handler, event_deliveries.aggregate_type, \
                 event_deliveries.aggregate_id, event_deliveries.event_id",
            placeholders(chunk.len(), 3, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            ready.insert(
                (
                    D::DB::get_string(&r, "handler").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_id").map_err(db)?,
                ),
                D::DB::get_string(&r, "event_id").map_err(db)?,
            );
        }
    }
    Ok(ready)
}

/// The indexes of the `places` the outbox holds under another event id: one statement per
/// [`CHUNK`] places.
pub(crate) async fn held_places<D: Dialect>(
    conn: &mut Conn<D>,
    places: &[PlaceQuery<'_>],
) -> Result<Vec<usize>, StoreError> {
    let mut held = Vec::new();
    for (n, chunk) in places.chunks(CHUNK).enumerate() {
        let ids: Vec<String> = chunk.iter().map(|p| p.event_id.to_string()).collect();
        let mut args = Vec::with_capacity(chunk.len() * 5);
        for (i, p) in chunk.iter().enumerate() {
            args.extend([
                Arg::I64((n * CHUNK + i) as i64),
                Arg::Str(p.aggregate_type),
                Arg::Str(p.aggregate_id),
                Arg::I64(p.sequence),
                Arg::Str(&ids[i]),
            ]);
        }
        // `o.sequence > 0` repeats the condition of the unique index on (aggregate type,
        // aggregate id, sequence), so that SQLite's planner uses that partial index.
        let sql = format!(
            "SELECT k.column1 AS i FROM (VALUES {}) AS k \
             WHERE EXISTS (SELECT 1 FROM event_outbox o \
                 WHERE o.aggregate_type = k.column2 AND o.aggregate_id = k.column3 \
                   AND o.sequence = k.column4 AND o.sequence > 0 \
                   AND o.event_id <> k.column5)",
            placeholders(chunk.len(), 5, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            held.push(D::DB::get_i64(&r, "i").map_err(db)? as usize);
        }
    }
    Ok(held)
}
