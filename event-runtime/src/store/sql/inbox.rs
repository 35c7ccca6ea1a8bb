//! What the SQL store keeps for transport inboxes: their dead letters (written with the batch
//! they came in, taken out again by a replay), the origin of every received event, and the
//! broker identity each inbox consumes (`event_inbox_identity`).

use sqlx::{Database, Pool};
use uuid::Uuid;

use super::audit::{self, NewAudit};
use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::inbox::Origin;
use crate::store::backend::{AuditStamp, InboxDeadLetter, TakenDeadLetter, TakenDeadLetters};
use crate::store::types::AuditEntry;
use crate::store::{from_ms, InboxIdentity, StoreError};

/// Writes `d` unless its inbox has a dead letter of that event id already; whether it wrote.
pub(crate) async fn insert_dead_letter<D: Dialect>(
    conn: &mut Conn<D>,
    d: &InboxDeadLetter,
    now: i64,
) -> Result<bool, StoreError> {
    const SQL: &str =
        "INSERT INTO event_dead_letters (event_id, handler, name, version, envelope, attempts,
            first_failed_at, last_failed_at, reason, error_chain, dead_at, kind, origin)
         SELECT $1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $7, 'inbox', $10
         WHERE NOT EXISTS (SELECT 1 FROM event_dead_letters
             WHERE kind = 'inbox' AND handler = $2 AND event_id = $1)";
    let event_id = d.event_id.to_string();
    let chain = serde_json::to_string(&d.error_chain).unwrap_or_else(|_| "[]".into());
    let origin = serde_json::to_string(&d.origin)
        .map_err(|e| StoreError::Corrupt(format!("dead letter origin: {e}")))?;
    let n = execute::<D>(
        conn,
        SQL,
        &[
            Arg::Str(&event_id),
            Arg::Str(&d.inbox),
            Arg::Str(&d.name),
            Arg::I64(i64::from(d.version)),
            Arg::Str(&d.body),
            Arg::I64(i64::try_from(d.origin.delivery_count).unwrap_or(i64::MAX)),
            Arg::I64(now),
            Arg::Str(d.reason.as_str()),
            Arg::Str(&chain),
            Arg::Str(&origin),
        ],
    )
    .await?;
    Ok(n > 0)
}

/// Marks the open inbox dead letters among `ids` (of `inbox` only, when given) replayed, with
/// one audit row naming them; returns it (none when no id was an open inbox dead letter) and
/// their bodies, in the order of `ids`.
pub(crate) async fn take_dead_letters<D: Dialect>(
    conn: &mut Conn<D>,
    ids: &[i64],
    inbox: Option<&str>,
    stamp: &AuditStamp<'_>,
) -> Result<TakenDeadLetters, StoreError> {
    let now = stamp.at;
    const TAKE: &str = "UPDATE event_dead_letters SET resolved_at = $1, resolution = 'replayed'
         WHERE id = $2 AND resolved_at IS NULL AND kind = 'inbox' AND ($3 IS NULL OR handler = $3)
         RETURNING envelope, origin";
    const NAME: &str = "UPDATE event_dead_letters SET audit_id = $1 WHERE id = $2";
    let mut taken = Vec::new();
    for &id in ids {
        let r = rows::<D>(
            conn,
            TAKE,
            &[Arg::I64(now), Arg::I64(id), Arg::OptStr(inbox)],
        )
        .await?;
        let Some(r) = r.first() else { continue };
        taken.push(TakenDeadLetter {
            id,
            body: D::DB::get_string(r, "envelope").map_err(db)?,
            // An origin that does not read does not stop the replay: the event is committed
            // without one.
            origin: D::DB::get_opt_string(r, "origin")
                .map_err(db)?
                .and_then(|o| serde_json::from_str(&o).ok()),
        });
    }
    if taken.is_empty() {
        return Ok(TakenDeadLetters {
            audit: None,
            letters: taken,
        });
    }
    let mut entry = audit::insert::<D>(conn, &NewAudit::finished("replay", *stamp)).await?;
    for t in &taken {
        execute::<D>(conn, NAME, &[Arg::I64(entry.id), Arg::I64(t.id)]).await?;
    }
    let ids = taken.iter().map(|t| t.id).collect();
    audit::name_dead_letters::<D>(conn, &mut entry, ids).await?;
    Ok(TakenDeadLetters {
        audit: Some(entry),
        letters: taken,
    })
}

/// The origin stored with the received event `event_id`.
pub(crate) async fn received_origin<D: Dialect>(
    pool: &Pool<D::DB>,
    event_id: Uuid,
) -> Result<Option<Origin>, StoreError> {
    const SQL: &str = "SELECT origin FROM event_outbox WHERE event_id = $1";
    let mut conn = pool.acquire().await.map_err(db)?;
    let id = event_id.to_string();
    let r = rows::<D>(&mut conn, SQL, &[Arg::Str(&id)]).await?;
    let Some(r) = r.first() else { return Ok(None) };
    D::DB::get_opt_string(r, "origin")
        .map_err(db)?
        .map(|o| {
            serde_json::from_str(&o)
                .map_err(|e| StoreError::Corrupt(format!("event {event_id} origin: {e}")))
        })
        .transpose()
}

fn identity_from_row<D: Dialect>(
    r: &<D::DB as Database>::Row,
) -> Result<InboxIdentity, StoreError> {
    Ok(InboxIdentity {
        inbox: D::DB::get_string(r, "inbox").map_err(db)?,
        stream: D::DB::get_string(r, "stream").map_err(db)?,
        stream_created: D::DB::get_string(r, "stream_created").map_err(db)?,
        consumer_created: D::DB::get_opt_string(r, "consumer_created").map_err(db)?,
        recorded_at: from_ms(D::DB::get_i64(r, "recorded_at").map_err(db)?),
    })
}

/// The identity recorded for `inbox`.
pub(crate) async fn identity<D: Dialect>(
    conn: &mut Conn<D>,
    inbox: &str,
) -> Result<Option<InboxIdentity>, StoreError> {
    const SQL: &str = "SELECT inbox, stream, stream_created, consumer_created, recorded_at \
         FROM event_inbox_identity WHERE inbox = $1";
    rows::<D>(conn, SQL, &[Arg::Str(inbox)])
        .await?
        .first()
        .map(identity_from_row::<D>)
        .transpose()
}

/// Records `i` when its inbox has none, or has one without a consumer on the same stream;
/// returns what is recorded after.
pub(crate) async fn record_identity<D: Dialect>(
    pool: &Pool<D::DB>,
    i: &InboxIdentity,
    now: i64,
) -> Result<InboxIdentity, StoreError> {
    const SQL: &str = "INSERT INTO event_inbox_identity \
         (inbox, stream, stream_created, consumer_created, recorded_at) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (inbox) DO UPDATE SET consumer_created = excluded.consumer_created, \
             recorded_at = excluded.recorded_at \
         WHERE event_inbox_identity.consumer_created IS NULL \
           AND event_inbox_identity.stream = excluded.stream \
           AND event_inbox_identity.stream_created = excluded.stream_created";
    let mut conn = pool.acquire().await.map_err(db)?;
    execute::<D>(&mut conn, SQL, &identity_args(i, now)).await?;
    identity::<D>(&mut conn, &i.inbox)
        .await?
        .ok_or_else(|| StoreError::Corrupt("the inbox identity just written is gone".into()))
}

fn identity_args(i: &InboxIdentity, now: i64) -> [Arg<'_>; 5] {
    [
        Arg::Str(&i.inbox),
        Arg::Str(&i.stream),
        Arg::Str(&i.stream_created),
        Arg::OptStr(i.consumer_created.as_deref()),
        Arg::I64(now),
    ]
}

/// Replaces the identity of `i.inbox`, with an audit row (action `inbox-adopt`), in one
/// transaction.
pub(crate) async fn adopt_identity<D: Dialect>(
    pool: &Pool<D::DB>,
    i: &InboxIdentity,
    stamp: &AuditStamp<'_>,
) -> Result<AuditEntry, StoreError> {
    let now = stamp.at;
    const SQL: &str = "INSERT INTO event_inbox_identity \
         (inbox, stream, stream_created, consumer_created, recorded_at) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (inbox) DO UPDATE SET stream = excluded.stream, \
             stream_created = excluded.stream_created, \
             consumer_created = excluded.consumer_created, recorded_at = excluded.recorded_at";
    let mut tx = D::begin(pool).await.map_err(db)?;
    execute::<D>(&mut tx, SQL, &identity_args(i, now)).await?;
    let entry = audit::insert::<D>(&mut tx, &NewAudit::finished("inbox-adopt", *stamp)).await?;
    tx.commit().await.map_err(db)?;
    Ok(entry)
}
