//! Chains: the order of each aggregate's events across a broker, as statements any SQL
//! dialect runs.
//!
//! Producer side, `event_relay_chain`: per (relay, aggregate), the last event the relay
//! published and the predecessor it named. Consumer side, `event_inbox_chain`: one row per
//! place of a received aggregate's chain, `released`, `held`, `dead` or `skipped`, and
//! `event_inbox_gaps`. A received event is released when it names no predecessor or its
//! predecessor is released (or skipped); releasing one releases the held events after it, in
//! chain order. The deliveries of a held event carry `held` and are never made ready. Gaps
//! are `gaps`'s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use sqlx::Pool;
use uuid::Uuid;

use super::append::StreamKey;
use super::exec::{placeholders, Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::backend::{ChainLink, LinkKind, Linked, RelayChainKey, RelayChainState};
use crate::store::StoreError;

/// Statements write at most this many rows each.
const CHUNK: usize = 200;

pub(crate) type AggKey = (String, String);

pub(crate) fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The relay chain rows of `keys` published at or after `fresh_after` (an older row is
/// expired: its chain restarts at 0): (last sequence, the previous it named) per key.
pub(crate) async fn relay_chain<D: Dialect>(
    pool: &Pool<D::DB>,
    keys: &[RelayChainKey],
    fresh_after: i64,
) -> Result<HashMap<RelayChainKey, RelayChainState>, StoreError> {
    let mut found = HashMap::new();
    if keys.is_empty() {
        return Ok(found);
    }
    let mut conn = pool.acquire().await.map_err(db)?;
    for chunk in keys.chunks(CHUNK) {
        let mut args = vec![Arg::I64(fresh_after)];
        for (d, t, i) in chunk {
            args.extend([Arg::Str(d), Arg::Str(t), Arg::Str(i)]);
        }
        let sql = format!(
            "SELECT c.destination, c.aggregate_type, c.aggregate_id, c.last_sequence, c.last_previous \
             FROM event_relay_chain c JOIN (VALUES {}) AS k ON c.destination = k.column1 \
               AND c.aggregate_type = k.column2 AND c.aggregate_id = k.column3 \
             WHERE c.published_at >= $1",
            placeholders(chunk.len(), 3, 2)
        );
        for r in rows::<D>(&mut conn, &sql, &args).await? {
            found.insert(
                (
                    D::DB::get_string(&r, "destination").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_id").map_err(db)?,
                ),
                RelayChainState {
                    last: D::DB::get_i64(&r, "last_sequence").map_err(db)?.max(0) as u64,
                    previous: D::DB::get_i64(&r, "last_previous").map_err(db)?.max(0) as u64,
                },
            );
        }
    }
    Ok(found)
}

/// Records that relay `destination` published event `sequence` of an aggregate naming
/// `previous` (a completed publish); a row that already names a later event is kept.
pub(crate) async fn record_relayed<D: Dialect>(
    conn: &mut Conn<D>,
    published: &[(&str, &str, &str, u64, u64)],
    now: i64,
) -> Result<(), StoreError> {
    // One row per key in a statement (PostgreSQL refuses to update a row twice in one).
    let mut last: BTreeMap<(&str, &str, &str), (u64, u64)> = BTreeMap::new();
    for &(d, t, i, s, p) in published {
        let e = last.entry((d, t, i)).or_insert((s, p));
        if s > e.0 {
            *e = (s, p);
        }
    }
    let rows: Vec<_> = last.into_iter().collect();
    for chunk in rows.chunks(CHUNK) {
        let mut args = vec![Arg::I64(now)];
        for ((d, t, i), (s, p)) in chunk {
            args.extend([
                Arg::Str(d),
                Arg::Str(t),
                Arg::Str(i),
                Arg::I64(i64_of(*s)),
                Arg::I64(i64_of(*p)),
            ]);
        }
        let values: Vec<String> = (0..chunk.len())
            .map(|r| {
                let b = 2 + r * 5;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, $1)",
                    b,
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO event_relay_chain (destination, aggregate_type, aggregate_id, last_sequence, last_previous, published_at) \
             VALUES {} ON CONFLICT (destination, aggregate_type, aggregate_id) DO UPDATE SET \
                 last_sequence = excluded.last_sequence, last_previous = excluded.last_previous, \
                 published_at = excluded.published_at \
             WHERE event_relay_chain.last_sequence <= excluded.last_sequence",
            values.join(", ")
        );
        execute::<D>(conn, &sql, &args).await?;
    }
    Ok(())
}

/// The state a link is written with.
fn initial_state(l: &ChainLink) -> &'static str {
    match l.kind {
        LinkKind::DeadLetter => "dead",
        LinkKind::Filler => "released",
        // A predecessor at or after the event itself is no predecessor (a producer's bug):
        // never held for it.
        LinkKind::Event if l.previous == 0 || l.previous >= l.sequence => "released",
        LinkKind::Event => "held",
    }
}

/// Links `links` into their aggregates' chains in the open transaction `conn`, then releases
/// what can be released. The aggregates' rows are locked first, in key order, so that two
/// transactions linking adjacent events of one aggregate run one after the other (the second
/// sees the first's rows: READ COMMITTED takes a snapshot per statement) instead of each
/// holding its event for the other. Returns what was held and released, and the runs of
/// deliveries released that were held before (to promote).
pub(crate) async fn link<D: Dialect>(
    conn: &mut Conn<D>,
    links: &[ChainLink],
    now: i64,
) -> Result<(Linked, Vec<StreamKey>), StoreError> {
    let mut seen = HashSet::new();
    let links: Vec<&ChainLink> = links
        .iter()
        .filter(|l| l.sequence > 0 && i64::try_from(l.sequence).is_ok())
        .filter(|l| seen.insert((&l.aggregate_type, &l.aggregate_id, l.sequence)))
        .collect();
    if links.is_empty() {
        return Ok((Linked::default(), Vec::new()));
    }
    let aggregates: BTreeSet<AggKey> = links
        .iter()
        .map(|l| (l.aggregate_type.clone(), l.aggregate_id.clone()))
        .collect();
    let aggregates: Vec<AggKey> = aggregates.into_iter().collect();
    lock_aggregates::<D>(conn, &aggregates, now).await?;
    // The events written held (a place that existed already keeps its state).
    let mut held_now: HashSet<String> = HashSet::new();
    for chunk in links.chunks(CHUNK) {
        let ids: Vec<String> = chunk.iter().map(|l| l.event_id.to_string()).collect();
        let mut args = Vec::with_capacity(chunk.len() * 7);
        for (n, l) in chunk.iter().enumerate() {
            args.extend([
                Arg::Str(&l.aggregate_type),
                Arg::Str(&l.aggregate_id),
                Arg::I64(i64_of(l.sequence)),
                Arg::I64(i64_of(l.previous)),
                Arg::Str(initial_state(l)),
                Arg::Str(&ids[n]),
                Arg::I64(now),
            ]);
        }
        // A place a dead letter held, or an accepted gap skipped, takes the event that
        // arrives for it (a replay; a late event an operator replays is released at once).
        // Any other place keeps what it has: the same event again, or a conflict.
        let sql = format!(
            "INSERT INTO event_inbox_chain (aggregate_type, aggregate_id, sequence, previous, state, event_id, recorded_at) \
             VALUES {} ON CONFLICT (aggregate_type, aggregate_id, sequence) DO UPDATE SET \
                 previous = excluded.previous, event_id = excluded.event_id, recorded_at = excluded.recorded_at, \
                 state = CASE WHEN event_inbox_chain.state = 'skipped' THEN 'released' ELSE excluded.state END \
             WHERE event_inbox_chain.state IN ('dead', 'skipped') AND excluded.state <> 'dead' \
             RETURNING event_id, state",
            placeholders(chunk.len(), 7, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            if D::DB::get_string(&r, "state").map_err(db)? == "held" {
                held_now.insert(D::DB::get_string(&r, "event_id").map_err(db)?);
            }
        }
    }
    // Arrived: their open gaps close.
    let arrived: Vec<(&str, &str, u64)> = links
        .iter()
        .filter(|l| l.kind != LinkKind::DeadLetter)
        .map(|l| {
            (
                l.aggregate_type.as_str(),
                l.aggregate_id.as_str(),
                l.sequence,
            )
        })
        .collect();
    let closed = close_gaps::<D>(conn, &arrived, "arrived", now).await?;
    let (released, streams) = release::<D>(conn, &aggregates).await?;
    let released_set: HashSet<Uuid> = released.iter().copied().collect();
    let held = links
        .iter()
        .filter(|l| l.kind == LinkKind::Event && held_now.contains(&l.event_id.to_string()))
        .map(|l| l.event_id)
        .filter(|id| !released_set.contains(id))
        .collect();
    Ok((
        Linked {
            held,
            released,
            closed_gaps: closed,
        },
        streams,
    ))
}

/// Locks (creating them) the rows of `aggregates`, in order, recording `now` as their last
/// activity.
pub(crate) async fn lock_aggregates<D: Dialect>(
    conn: &mut Conn<D>,
    aggregates: &[AggKey],
    now: i64,
) -> Result<(), StoreError> {
    for chunk in aggregates.chunks(CHUNK) {
        let mut args = vec![Arg::I64(now)];
        for (t, i) in chunk {
            args.extend([Arg::Str(t), Arg::Str(i)]);
        }
        let values: Vec<String> = (0..chunk.len())
            .map(|r| format!("(${}, ${}, $1)", 2 + r * 2, 3 + r * 2))
            .collect();
        let sql = format!(
            "INSERT INTO event_inbox_chain_aggregates (aggregate_type, aggregate_id, last_at) VALUES {} \
             ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_at = excluded.last_at",
            values.join(", ")
        );
        execute::<D>(conn, &sql, &args).await?;
    }
    Ok(())
}

/// Closes, as `resolution` (`arrived`, `accepted`), the open gaps whose missing place is one
/// of `places` (aggregate type, aggregate id, sequence).
pub(crate) async fn close_gaps<D: Dialect>(
    conn: &mut Conn<D>,
    places: &[(&str, &str, u64)],
    resolution: &str,
    now: i64,
) -> Result<u64, StoreError> {
    let mut closed = 0;
    for chunk in places.chunks(CHUNK) {
        let mut args = vec![Arg::I64(now), Arg::Str(resolution)];
        for (t, i, s) in chunk {
            args.extend([Arg::Str(t), Arg::Str(i), Arg::I64(i64_of(*s))]);
        }
        let sql = format!(
            "UPDATE event_inbox_gaps SET closed_at = $1, resolution = $2 \
             FROM (VALUES {}) AS k \
             WHERE event_inbox_gaps.closed_at IS NULL AND event_inbox_gaps.aggregate_type = k.column1 \
               AND event_inbox_gaps.aggregate_id = k.column2 AND event_inbox_gaps.missing_sequence = k.column3",
            placeholders(chunk.len(), 3, 3)
        );
        closed += execute::<D>(conn, &sql, &args).await?;
    }
    Ok(closed)
}

/// Releases, in chain order, every held place of `aggregates` whose predecessor is released
/// or skipped; clears the `held` flag of their deliveries. Returns the released event ids and
/// the runs of the deliveries released (to promote).
pub(crate) async fn release<D: Dialect>(
    conn: &mut Conn<D>,
    aggregates: &[AggKey],
) -> Result<(Vec<Uuid>, Vec<StreamKey>), StoreError> {
    // The held places, per aggregate, in sequence order: (sequence, previous, event id).
    let mut held: HashMap<AggKey, Vec<(i64, i64, String)>> = HashMap::new();
    for chunk in aggregates.chunks(CHUNK) {
        let mut args = Vec::with_capacity(chunk.len() * 2);
        for (t, i) in chunk {
            args.extend([Arg::Str(t), Arg::Str(i)]);
        }
        let sql = format!(
            "SELECT c.aggregate_type, c.aggregate_id, c.sequence, c.previous, c.event_id \
             FROM event_inbox_chain c JOIN (VALUES {}) AS k \
               ON c.aggregate_type = k.column1 AND c.aggregate_id = k.column2 \
             WHERE c.state = 'held'",
            placeholders(chunk.len(), 2, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            held.entry((
                D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                D::DB::get_string(&r, "aggregate_id").map_err(db)?,
            ))
            .or_default()
            .push((
                D::DB::get_i64(&r, "sequence").map_err(db)?,
                D::DB::get_i64(&r, "previous").map_err(db)?,
                D::DB::get_string(&r, "event_id").map_err(db)?,
            ));
        }
    }
    if held.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    // Their predecessors' states.
    let wanted: Vec<(&AggKey, i64)> = held
        .iter()
        .flat_map(|(k, v)| v.iter().map(move |(_, p, _)| (k, *p)))
        .collect();
    let mut passable: HashSet<(AggKey, i64)> = HashSet::new();
    for chunk in wanted.chunks(CHUNK) {
        let mut args = Vec::with_capacity(chunk.len() * 3);
        for ((t, i), p) in chunk {
            args.extend([Arg::Str(t), Arg::Str(i), Arg::I64(*p)]);
        }
        let sql = format!(
            "SELECT c.aggregate_type, c.aggregate_id, c.sequence FROM event_inbox_chain c \
             JOIN (VALUES {}) AS k ON c.aggregate_type = k.column1 AND c.aggregate_id = k.column2 \
               AND c.sequence = k.column3 \
             WHERE c.state IN ('released', 'skipped')",
            placeholders(chunk.len(), 3, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            passable.insert((
                (
                    D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                    D::DB::get_string(&r, "aggregate_id").map_err(db)?,
                ),
                D::DB::get_i64(&r, "sequence").map_err(db)?,
            ));
        }
    }
    let mut released: Vec<(&AggKey, i64, &str)> = Vec::new();
    for (k, places) in held.iter_mut() {
        places.sort();
        for (s, p, id) in places.iter() {
            if passable.contains(&(k.clone(), *p)) {
                passable.insert((k.clone(), *s));
                released.push((k, *s, id));
            }
        }
    }
    if released.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    for chunk in released.chunks(CHUNK) {
        let mut args = Vec::with_capacity(chunk.len() * 3);
        for ((t, i), s, _) in chunk {
            args.extend([Arg::Str(t), Arg::Str(i), Arg::I64(*s)]);
        }
        let sql = format!(
            "UPDATE event_inbox_chain SET state = 'released' FROM (VALUES {}) AS k \
             WHERE event_inbox_chain.aggregate_type = k.column1 AND event_inbox_chain.aggregate_id = k.column2 \
               AND event_inbox_chain.sequence = k.column3 AND event_inbox_chain.state = 'held'",
            placeholders(chunk.len(), 3, 1)
        );
        execute::<D>(conn, &sql, &args).await?;
    }
    let mut ids = Vec::with_capacity(released.len());
    let mut streams = Vec::new();
    for chunk in released.chunks(CHUNK) {
        let list: Vec<&str> = chunk.iter().map(|(_, _, id)| *id).collect();
        let list = serde_json::to_string(&list).unwrap_or_else(|_| "[]".into());
        let sql = format!(
            "UPDATE event_deliveries SET held = FALSE WHERE held AND {} \
             RETURNING handler, aggregate_type, aggregate_id",
            D::text_in("event_id", "$1")
        );
        for r in rows::<D>(conn, &sql, &[Arg::Str(&list)]).await? {
            streams.push((
                D::DB::get_string(&r, "handler").map_err(db)?,
                D::DB::get_string(&r, "aggregate_type").map_err(db)?,
                D::DB::get_string(&r, "aggregate_id").map_err(db)?,
            ));
        }
        for (_, _, id) in chunk {
            ids.push(Uuid::parse_str(id).map_err(|e| {
                StoreError::Corrupt(format!("event_inbox_chain.event_id {id:?}: {e}"))
            })?);
        }
    }
    streams.sort();
    streams.dedup();
    Ok((ids, streams))
}

/// The places of `places` whose event is late: at or before a place an accepted gap skipped
/// in their aggregate, and not taken by an event already (the events after the skipped place
/// were released without them): indexes into `places`.
pub(crate) async fn skipped_places<D: Dialect>(
    conn: &mut Conn<D>,
    places: &[(&str, &str, u64)],
) -> Result<Vec<usize>, StoreError> {
    let mut found = Vec::new();
    for (n, chunk) in places.chunks(CHUNK).enumerate() {
        let mut args = Vec::with_capacity(chunk.len() * 4);
        for (i, (t, a, s)) in chunk.iter().enumerate() {
            args.extend([
                Arg::I64((n * CHUNK + i) as i64),
                Arg::Str(t),
                Arg::Str(a),
                Arg::I64(i64_of(*s)),
            ]);
        }
        let sql = format!(
            "SELECT k.column1 AS i FROM (VALUES {}) AS k WHERE EXISTS (SELECT 1 FROM event_inbox_chain c \
               WHERE c.aggregate_type = k.column2 AND c.aggregate_id = k.column3 \
                 AND c.sequence >= k.column4 AND c.state = 'skipped') \
             AND NOT EXISTS (SELECT 1 FROM event_inbox_chain t \
               WHERE t.aggregate_type = k.column2 AND t.aggregate_id = k.column3 \
                 AND t.sequence = k.column4 AND t.state <> 'skipped')",
            placeholders(chunk.len(), 4, 1)
        );
        for r in rows::<D>(conn, &sql, &args).await? {
            found.push(D::DB::get_i64(&r, "i").map_err(db)? as usize);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Retention of chain state: relay rows of aggregates that published nothing since
/// `cutoff`, and received aggregates idle since `cutoff` (their places, unless held or dead,
/// and their row); at most `limit` rows each. Returns the rows deleted.
pub(crate) async fn purge_chains<D: Dialect>(
    pool: &Pool<D::DB>,
    cutoff: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let mut n = execute::<D>(
        &mut conn,
        "DELETE FROM event_relay_chain WHERE (destination, aggregate_type, aggregate_id) IN \
         (SELECT destination, aggregate_type, aggregate_id FROM event_relay_chain \
          WHERE published_at < $1 LIMIT $2)",
        &[Arg::I64(cutoff), Arg::I64(limit as i64)],
    )
    .await?;
    n += execute::<D>(
        &mut conn,
        "DELETE FROM event_inbox_chain WHERE state IN ('released', 'skipped') \
           AND (aggregate_type, aggregate_id) IN (SELECT aggregate_type, aggregate_id \
               FROM event_inbox_chain_aggregates WHERE last_at < $1 LIMIT $2)",
        &[Arg::I64(cutoff), Arg::I64(limit as i64)],
    )
    .await?;
    n += execute::<D>(
        &mut conn,
        "DELETE FROM event_inbox_chain_aggregates WHERE last_at < $1 \
           AND NOT EXISTS (SELECT 1 FROM event_inbox_chain c \
               WHERE c.aggregate_type = event_inbox_chain_aggregates.aggregate_type \
                 AND c.aggregate_id = event_inbox_chain_aggregates.aggregate_id)",
        &[Arg::I64(cutoff)],
    )
    .await?;
    Ok(n)
}
