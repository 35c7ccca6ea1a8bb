//! Groups of inbox instances that share the partitions of a stream: each instance's lease
//! (`event_inbox_members`) and which instance holds which partition
//! (`event_inbox_partitions`), in the consuming service's database that every instance of the
//! group shares. Talks to no broker and decides no assignment: the transport's group
//! (`transport::nats::NatsGroup`) does; the SQL is the backend's.
//!
//! Times are the instances' clocks (milliseconds since the Unix epoch, as every lease of the
//! outbox): the instances of a group must agree on the time within a small part of the lease
//! period (NTP does).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{now_ms, Store, StoreError};

/// An instance of a group, as its lease row says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GroupMember {
    /// The instance's name in the group.
    pub member: String,
    /// When it joined (its first renewal).
    pub started_at: DateTime<Utc>,
    /// When it last renewed its lease.
    pub renewed_at: DateTime<Utc>,
    /// When its lease ends unless renewed.
    pub expires_at: DateTime<Utc>,
    /// Whether its lease had not expired when read.
    pub live: bool,
}

/// A partition of a group, as its lease row says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PartitionLease {
    /// The partition, `0..P`.
    pub partition: u32,
    /// The instance that holds or last held it (`None`: released).
    pub owner: Option<String>,
    /// When the owner took it.
    pub taken_at: DateTime<Utc>,
    /// When the owner's hold ends unless renewed.
    pub expires_at: DateTime<Utc>,
    /// Whether it was held (an owner whose lease had not expired) when read.
    pub held: bool,
}

/// A group's instances and partitions as read at one time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// When it was read.
    pub at: DateTime<Utc>,
    /// Its instances, live or expired (an expired one is forgotten after ten lease periods),
    /// by name.
    pub members: Vec<GroupMember>,
    /// Its partitions that were ever taken, by number.
    pub partitions: Vec<PartitionLease>,
}

impl GroupView {
    /// The names of the instances whose lease had not expired.
    pub fn live_members(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.member.clone())
            .collect()
    }

    /// The partitions `member` held.
    pub fn held_by(&self, member: &str) -> Vec<u32> {
        self.partitions
            .iter()
            .filter(|p| p.held && p.owner.as_deref() == Some(member))
            .map(|p| p.partition)
            .collect()
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Renews the lease of `member` in `group` for `lease` from now (joining the group when it
    /// has no row), and the leases of the partitions it holds that have not expired; forgets
    /// the members whose lease expired ten `lease` periods ago; returns the group as it is
    /// then, in one transaction.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is renewed then. [`StoreError::Corrupt`] for a row of
    /// the wrong shape.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn group_heartbeat(
        &self,
        group: &str,
        member: &str,
        lease: Duration,
    ) -> Result<GroupView, StoreError> {
        let now = now_ms();
        let forget = now.saturating_sub(ms(lease).saturating_mul(10));
        self.leasing()?
            .group_beat(group, member, now, now.saturating_add(ms(lease)), forget)
            .await
    }

    /// Gives `partition` of `group` to `member` for `lease` from now, when nobody holds it
    /// (never taken, released, or its holder's lease expired) or `member` does already;
    /// whether it did. Exclusive: of two instances claiming at once, one gets it.
    ///
    /// # Errors
    /// [`StoreError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: one statement, made or not.
    pub async fn claim_partition(
        &self,
        group: &str,
        partition: u32,
        member: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        self.leasing()?
            .claim_partition(group, partition, member, now, now.saturating_add(ms(lease)))
            .await
    }

    /// Releases the partitions `partitions` of `group` that `member` holds (every one with
    /// `None`), so that another instance takes them at once instead of after their lease;
    /// with `leave`, deletes `member`'s own row too (a graceful stop). Returns how many it
    /// released.
    ///
    /// # Errors
    /// [`StoreError::Database`]; nothing is released then.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped before its COMMIT, nothing is changed.
    pub async fn release_partitions(
        &self,
        group: &str,
        member: &str,
        partitions: Option<&[u32]>,
        leave: bool,
    ) -> Result<u64, StoreError> {
        self.leasing()?
            .release_partitions(group, member, partitions, leave)
            .await
    }

    /// The instances and partitions of `group` as they are now (`events nats group status`).
    ///
    /// # Errors
    /// [`StoreError::Database`]; [`StoreError::Corrupt`] for a row of the wrong shape.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn group_view(&self, group: &str) -> Result<GroupView, StoreError> {
        self.leasing()?.group_view(group, now_ms()).await
    }
}
