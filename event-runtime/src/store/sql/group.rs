//! Groups of inbox instances, as statements any SQL dialect runs: each instance's lease
//! (`event_inbox_members`) and which instance holds which partition (`event_inbox_partitions`).
//! Decides nothing about who should hold what: the transport's group does.

use sqlx::Pool;

use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Conn, Dialect};
use crate::store::group::{GroupMember, GroupView, PartitionLease};
use crate::store::{from_ms, StoreError};

/// Members and partitions of `group` as they are at `now`.
async fn view<D: Dialect>(
    conn: &mut Conn<D>,
    group: &str,
    now: i64,
) -> Result<GroupView, StoreError> {
    let members = rows::<D>(
        conn,
        "SELECT member, started_at, renewed_at, expires_at FROM event_inbox_members \
         WHERE group_name = $1 ORDER BY member",
        &[Arg::Str(group)],
    )
    .await?
    .iter()
    .map(|r| {
        let expires = D::DB::get_i64(r, "expires_at").map_err(db)?;
        Ok(GroupMember {
            member: D::DB::get_string(r, "member").map_err(db)?,
            started_at: from_ms(D::DB::get_i64(r, "started_at").map_err(db)?),
            renewed_at: from_ms(D::DB::get_i64(r, "renewed_at").map_err(db)?),
            expires_at: from_ms(expires),
            live: expires > now,
        })
    })
    .collect::<Result<Vec<_>, StoreError>>()?;
    let partitions = rows::<D>(
        conn,
        "SELECT partition_no, owner, taken_at, expires_at FROM event_inbox_partitions \
         WHERE group_name = $1 ORDER BY partition_no",
        &[Arg::Str(group)],
    )
    .await?
    .iter()
    .map(|r| {
        let expires = D::DB::get_i64(r, "expires_at").map_err(db)?;
        let owner = D::DB::get_opt_string(r, "owner").map_err(db)?;
        let partition = D::DB::get_i64(r, "partition_no").map_err(db)?;
        Ok(PartitionLease {
            partition: u32::try_from(partition)
                .map_err(|_| StoreError::Corrupt(format!("partition number {partition}")))?,
            held: owner.is_some() && expires > now,
            owner,
            taken_at: from_ms(D::DB::get_i64(r, "taken_at").map_err(db)?),
            expires_at: from_ms(expires),
        })
    })
    .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(GroupView {
        group: group.to_owned(),
        at: from_ms(now),
        members,
        partitions,
    })
}

/// Renews `member`'s lease and those of the partitions it holds (to `expires`), deletes the
/// members expired before `forget_before`, and returns the group.
pub(crate) async fn beat<D: Dialect>(
    pool: &Pool<D::DB>,
    group: &str,
    member: &str,
    now: i64,
    expires: i64,
    forget_before: i64,
) -> Result<GroupView, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    let conn: &mut Conn<D> = &mut tx;
    execute::<D>(
        conn,
        "INSERT INTO event_inbox_members (group_name, member, started_at, renewed_at, expires_at) \
         VALUES ($1, $2, $3, $3, $4) \
         ON CONFLICT (group_name, member) DO UPDATE SET renewed_at = excluded.renewed_at, \
             expires_at = excluded.expires_at",
        &[
            Arg::Str(group),
            Arg::Str(member),
            Arg::I64(now),
            Arg::I64(expires),
        ],
    )
    .await?;
    // Only leases not expired: one that lapsed may be another's by now.
    execute::<D>(
        conn,
        "UPDATE event_inbox_partitions SET expires_at = $3 \
         WHERE group_name = $1 AND owner = $2 AND expires_at > $4",
        &[
            Arg::Str(group),
            Arg::Str(member),
            Arg::I64(expires),
            Arg::I64(now),
        ],
    )
    .await?;
    execute::<D>(
        conn,
        "DELETE FROM event_inbox_members WHERE group_name = $1 AND expires_at < $2",
        &[Arg::Str(group), Arg::I64(forget_before)],
    )
    .await?;
    let view = view::<D>(conn, group, now).await?;
    tx.commit().await.map_err(db)?;
    Ok(view)
}

/// Gives `partition` of `group` to `member` until `expires` when nobody holds it (released,
/// never taken, or its lease expired at `now`) or `member` does; whether it did.
pub(crate) async fn claim<D: Dialect>(
    pool: &Pool<D::DB>,
    group: &str,
    partition: u32,
    member: &str,
    now: i64,
    expires: i64,
) -> Result<bool, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let n = execute::<D>(
        &mut conn,
        "INSERT INTO event_inbox_partitions (group_name, partition_no, owner, taken_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (group_name, partition_no) DO UPDATE SET owner = excluded.owner, \
             taken_at = excluded.taken_at, expires_at = excluded.expires_at \
         WHERE event_inbox_partitions.owner IS NULL OR event_inbox_partitions.owner = excluded.owner \
            OR event_inbox_partitions.expires_at <= excluded.taken_at",
        &[
            Arg::Str(group),
            Arg::I64(i64::from(partition)),
            Arg::Str(member),
            Arg::I64(now),
            Arg::I64(expires),
        ],
    )
    .await?;
    Ok(n > 0)
}

/// Releases the partitions `partitions` (all when `None`) that `member` holds in `group`; with
/// `leave`, deletes its member row too. Partitions released.
pub(crate) async fn release<D: Dialect>(
    pool: &Pool<D::DB>,
    group: &str,
    member: &str,
    partitions: Option<&[u32]>,
    leave: bool,
) -> Result<u64, StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    let conn: &mut Conn<D> = &mut tx;
    let mut released = 0;
    const RELEASE: &str = "UPDATE event_inbox_partitions SET owner = NULL \
         WHERE group_name = $1 AND owner = $2 AND ($3 IS NULL OR partition_no = $3)";
    match partitions {
        None => {
            released += execute::<D>(
                conn,
                RELEASE,
                &[Arg::Str(group), Arg::Str(member), Arg::OptI64(None)],
            )
            .await?;
        }
        Some(ps) => {
            for &p in ps {
                released += execute::<D>(
                    conn,
                    RELEASE,
                    &[
                        Arg::Str(group),
                        Arg::Str(member),
                        Arg::OptI64(Some(i64::from(p))),
                    ],
                )
                .await?;
            }
        }
    }
    if leave {
        execute::<D>(
            conn,
            "DELETE FROM event_inbox_members WHERE group_name = $1 AND member = $2",
            &[Arg::Str(group), Arg::Str(member)],
        )
        .await?;
    }
    tx.commit().await.map_err(db)?;
    Ok(released)
}

/// The group as it is at `now`.
pub(crate) async fn group_view<D: Dialect>(
    pool: &Pool<D::DB>,
    group: &str,
    now: i64,
) -> Result<GroupView, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    view::<D>(&mut conn, group, now).await
}
