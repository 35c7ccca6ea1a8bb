//! [`Backend`] and every capability for [`SqlStore`], once for every dialect: each method hands its work to the
//! module of its job (`claim`, `delivery`, `dead_letters`, `inbox`, …).

use std::any::{Any, TypeId};
use std::collections::HashMap;

use async_trait::async_trait;
use uuid::Uuid;

use super::portable::{portable_execute, portable_fetch};
use super::{
    audit, begin_relaxed, chain, commit_and_promote, db, dead_letters, delivery, gaps, group,
    inbox, maintenance, operator, republish, resolution, retarget, Conn, Dialect, SqlStore, SqlTx,
};
use crate::inbox::Origin;
use crate::store::backend::{
    AuditStamp, Backend, ChainStore, ClaimRequest, ClaimedDelivery, DeadLetterOperations,
    DestinationOperation, DestinationOperations, DestinationPage, Gap, Inspection, OperationLog,
    PartitionLeases, Pause, PendingEnvelope, ProbeClaim, ProbeRequest, PurgeStep, RelayChainKey,
    RelayChainState, RepublishPage, RepublishSelection, RepublishStart, ResolutionOperation,
    ResolutionSelection, ResolutionStart, ResolvedPage, SettleResult, Settlement,
};
use crate::store::query::Row;
use crate::store::types::{
    AuditEntry, Backlog, CatalogRecord, DeadLetter, DeadLetterCount, DeadLetterFilter, OutboxStats,
    PausedDestination, Resolution,
};
use crate::store::value::Datum;
use crate::store::{DatabaseError, GroupView, InboxIdentity, StoreError, Tx};

#[async_trait]
impl<D: Dialect> Backend for SqlStore<D> {
    fn name(&self) -> &'static str {
        D::NAME
    }

    fn native_transaction_types(&self) -> Vec<TypeId> {
        vec![TypeId::of::<Conn<D>>()]
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        D::migrate(&self.pool).await
    }

    async fn has_outbox(&self) -> Result<bool, StoreError> {
        maintenance::has_outbox::<D>(&self.pool).await
    }

    async fn begin(&self) -> Result<Tx, StoreError> {
        let tx = D::begin(&self.pool).await.map_err(db)?;
        Ok(Tx::from_backend(Box::new(SqlTx::<D>::new(
            tx,
            self.pool.clone(),
        ))))
    }

    async fn execute(&self, sql: &str, args: &[Datum]) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        portable_execute::<D>(&mut conn, sql, args).await
    }

    async fn fetch(
        &self,
        sql: &str,
        args: &[Datum],
        first_only: bool,
    ) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        portable_fetch::<D>(&mut conn, sql, args, first_only).await
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    fn is_conflict(&self, error: &(dyn std::error::Error + 'static)) -> bool {
        event_core::ErrorChain(error).into_iter().any(|e| {
            let sqlx = match e.downcast_ref::<StoreError>() {
                Some(StoreError::Database(d)) => d.backend_error().downcast_ref::<sqlx::Error>(),
                _ => e
                    .downcast_ref::<DatabaseError>()
                    .and_then(|d| d.backend_error().downcast_ref::<sqlx::Error>())
                    .or_else(|| e.downcast_ref::<sqlx::Error>()),
            };
            let db = match sqlx {
                Some(sqlx::Error::Database(db)) => Some(db),
                _ => None,
            };
            db.is_some_and(|db| D::is_conflict(db.as_ref()))
        })
    }

    async fn renew_lease(&self, token: &str, expires_at: i64) -> Result<bool, StoreError> {
        delivery::renew_lease::<D>(&self.pool, token, expires_at).await
    }

    async fn drop_lease(&self, token: &str) -> Result<u64, StoreError> {
        delivery::drop_lease::<D>(&self.pool, token).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<ClaimedDelivery>, StoreError> {
        D::claim(&self.pool, req).await
    }

    async fn settle(
        &self,
        token: &str,
        now: i64,
        batch: &[Settlement<'_>],
    ) -> Result<Vec<SettleResult>, StoreError> {
        // The whole batch in one statement per kind first; if the database refuses one of
        // them, again with each settlement contained in its own savepoint, so that one row
        // the database refuses cannot keep the others from being recorded.
        let mut tx = begin_relaxed::<D>(&self.pool).await?;
        let (results, streams) =
            match delivery::settle::<D>(&mut tx, token, now, batch, false).await {
                Ok(done) => done,
                Err(_) => {
                    drop(tx);
                    tx = begin_relaxed::<D>(&self.pool).await?;
                    delivery::settle::<D>(&mut tx, token, now, batch, true).await?
                }
            };
        commit_and_promote::<D>(tx, &self.pool, &streams).await?;
        Ok(results)
    }

    async fn repair_runs(&self, expired_before: i64) -> Result<u64, StoreError> {
        delivery::repair_runs::<D>(&self.pool, expired_before).await
    }

    async fn progressing(&self, destinations: &[String]) -> Result<u64, StoreError> {
        delivery::progressing::<D>(&self.pool, destinations).await
    }

    async fn claim_probe(&self, req: &ProbeRequest<'_>) -> Result<ProbeClaim, StoreError> {
        super::breaker::claim_probe::<D>(&self.pool, req).await
    }

    async fn pause(&self, pause: &Pause) -> Result<(), StoreError> {
        delivery::pause::<D>(&self.pool, pause).await
    }

    async fn resume(&self, destination: &str, paused_by: &str) -> Result<bool, StoreError> {
        delivery::resume::<D>(&self.pool, destination, paused_by).await
    }

    async fn paused(&self, now: i64) -> Result<Vec<PausedDestination>, StoreError> {
        delivery::paused::<D>(&self.pool, now).await
    }

    async fn purge_completed(&self, cutoff: i64, batch: u32) -> Result<PurgeStep, StoreError> {
        maintenance::purge_completed::<D>(&self.pool, cutoff, batch).await
    }

    async fn refresh_statistics(&self) -> Result<(), StoreError> {
        D::refresh_statistics(&self.pool).await.map_err(db)
    }

    async fn stats(&self, now: i64) -> Result<OutboxStats, StoreError> {
        maintenance::stats::<D>(&self.pool, now).await
    }

    async fn backlog(&self, now: i64) -> Result<Backlog, StoreError> {
        maintenance::backlog::<D>(&self.pool, now).await
    }

    async fn record_catalog(&self, entries: &[CatalogRecord], now: i64) -> Result<(), StoreError> {
        super::catalog::record::<D>(&self.pool, entries, now).await
    }

    async fn catalog(&self) -> Result<Vec<CatalogRecord>, StoreError> {
        super::catalog::read::<D>(&self.pool).await
    }

    fn inspection(&self) -> Option<&dyn Inspection> {
        Some(self)
    }

    fn dead_letter_operations(&self) -> Option<&dyn DeadLetterOperations> {
        Some(self)
    }

    fn destination_operations(&self) -> Option<&dyn DestinationOperations> {
        Some(self)
    }

    fn operation_log(&self) -> Option<&dyn OperationLog> {
        Some(self)
    }

    fn partition_leases(&self) -> Option<&dyn PartitionLeases> {
        Some(self)
    }
}

#[async_trait]
impl<D: Dialect> ChainStore for SqlStore<D> {
    async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        inbox::identity::<D>(&mut conn, inbox).await
    }

    async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
        now: i64,
    ) -> Result<InboxIdentity, StoreError> {
        inbox::record_identity::<D>(&self.pool, identity, now).await
    }

    async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError> {
        inbox::adopt_identity::<D>(&self.pool, identity, stamp).await
    }

    async fn received_origin(&self, event_id: Uuid) -> Result<Option<Origin>, StoreError> {
        inbox::received_origin::<D>(&self.pool, event_id).await
    }

    async fn relay_chain(
        &self,
        keys: &[RelayChainKey],
        fresh_after: i64,
    ) -> Result<HashMap<RelayChainKey, RelayChainState>, StoreError> {
        chain::relay_chain::<D>(&self.pool, keys, fresh_after).await
    }

    async fn published_sequences(
        &self,
        destination: &str,
        aggregate: (&str, &str),
        below: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StoreError> {
        republish::published_sequences::<D>(&self.pool, destination, aggregate, below, limit).await
    }

    async fn open_gaps(
        &self,
        older_than: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<Gap>, StoreError> {
        gaps::open_gaps::<D>(&self.pool, older_than, now, limit).await
    }

    async fn gaps(&self, all: bool, after: i64, limit: usize) -> Result<Vec<Gap>, StoreError> {
        gaps::gaps::<D>(&self.pool, all, after, limit).await
    }

    async fn accept_gaps(
        &self,
        ids: &[i64],
        audit_id: i64,
        now: i64,
    ) -> Result<Vec<Gap>, StoreError> {
        let mut tx = D::begin(&self.pool).await.map_err(db)?;
        let (accepted, streams) = gaps::accept_gaps::<D>(&mut tx, ids, audit_id, now).await?;
        let heads = super::append::promote::<D>(&mut tx, &streams).await?;
        audit::add_to_count::<D>(&mut tx, audit_id, accepted.len() as u64).await?;
        let waiting: Vec<_> = streams
            .into_iter()
            .filter(|s| !heads.contains_key(s))
            .collect();
        commit_and_promote::<D>(tx, &self.pool, &waiting).await?;
        Ok(accepted)
    }

    async fn held_events(&self) -> Result<u64, StoreError> {
        gaps::held_events::<D>(&self.pool).await
    }

    async fn purge_chains(&self, cutoff: i64, limit: usize) -> Result<u64, StoreError> {
        chain::purge_chains::<D>(&self.pool, cutoff, limit).await
    }
}

#[async_trait]
impl<D: Dialect> Inspection for SqlStore<D> {
    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError> {
        dead_letters::list::<D>(&self.pool, filter).await
    }

    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        operator::count_dead_letters::<D>(&self.pool, filter).await
    }

    async fn dead_letter_counts(&self) -> Result<Vec<DeadLetterCount>, StoreError> {
        operator::dead_letter_counts::<D>(&self.pool).await
    }

    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        dead_letters::audit_log::<D>(&self.pool, limit).await
    }

    async fn pending_envelopes(&self) -> Result<Vec<PendingEnvelope>, StoreError> {
        dead_letters::pending_envelopes::<D>(&self.pool).await
    }

    async fn undelivered_event_names(&self, destination: &str) -> Result<Vec<String>, StoreError> {
        retarget::undelivered_event_names::<D>(&self.pool, destination).await
    }

    async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since: i64,
        cap: u64,
    ) -> Result<Option<u64>, StoreError> {
        operator::unrouted_events::<D>(&self.pool, destination, names, since, cap).await
    }
}

#[async_trait]
impl<D: Dialect> DeadLetterOperations for SqlStore<D> {
    async fn resolve_dead_letters(
        &self,
        ids: &[i64],
        action: Resolution,
        stamp: &AuditStamp<'_>,
        progress: &mut (dyn FnMut(usize) + Send),
    ) -> Result<AuditEntry, StoreError> {
        let mut tx = D::begin(&self.pool).await.map_err(db)?;
        let (entry, streams) =
            dead_letters::resolve::<D>(&mut tx, ids, action, stamp, progress).await?;
        commit_and_promote::<D>(tx, &self.pool, &streams).await?;
        Ok(entry)
    }

    async fn start_resolution(
        &self,
        filter: &DeadLetterFilter,
        action: Resolution,
        stamp: &AuditStamp<'_>,
    ) -> Result<ResolutionStart, StoreError> {
        resolution::start::<D>(&self.pool, filter, action, stamp).await
    }

    async fn resolve_page(
        &self,
        audit_id: i64,
        action: Resolution,
        selection: &ResolutionSelection,
        page: u32,
        now: i64,
    ) -> Result<ResolvedPage, StoreError> {
        resolution::page::<D>(&self.pool, audit_id, action, selection, page, now).await
    }

    async fn resolution(&self, audit_id: i64) -> Result<Option<ResolutionOperation>, StoreError> {
        resolution::load::<D>(&self.pool, audit_id).await
    }
}

#[async_trait]
impl<D: Dialect> DestinationOperations for SqlStore<D> {
    async fn start_destination_operation(
        &self,
        op: &DestinationOperation,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError> {
        retarget::start::<D>(&self.pool, op, stamp).await
    }

    async fn destination_page(
        &self,
        audit_id: i64,
        op: &DestinationOperation,
        page: u32,
        now: i64,
    ) -> Result<DestinationPage, StoreError> {
        retarget::page::<D>(&self.pool, audit_id, op, page, now).await
    }

    async fn pause_audited(
        &self,
        destination: &str,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError> {
        operator::pause_audited::<D>(&self.pool, destination, stamp).await
    }

    async fn resume_audited(
        &self,
        destination: &str,
        stamp: &AuditStamp<'_>,
    ) -> Result<Option<AuditEntry>, StoreError> {
        operator::resume_audited::<D>(&self.pool, destination, stamp).await
    }

    async fn start_republish(
        &self,
        selection: &RepublishSelection,
        stamp: &AuditStamp<'_>,
    ) -> Result<RepublishStart, StoreError> {
        republish::start::<D>(&self.pool, selection, stamp).await
    }

    async fn republish_page(
        &self,
        audit_id: i64,
        selection: &RepublishSelection,
        started: i64,
        after: &str,
        page: u32,
        now: i64,
    ) -> Result<RepublishPage, StoreError> {
        republish::page::<D>(&self.pool, audit_id, selection, started, after, page, now).await
    }
}

#[async_trait]
impl<D: Dialect> OperationLog for SqlStore<D> {
    async fn start_audit(
        &self,
        action: &str,
        selection: Option<&str>,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        audit::insert::<D>(
            &mut conn,
            &audit::NewAudit {
                action,
                stamp: *stamp,
                selection,
                finished: false,
            },
        )
        .await
    }

    async fn add_to_audit_count(&self, audit_id: i64, n: u64) -> Result<(), StoreError> {
        republish::add_to_audit_count::<D>(&self.pool, audit_id, n).await
    }

    async fn finish_operation(&self, audit_id: i64, now: i64) -> Result<AuditEntry, StoreError> {
        resolution::finish::<D>(&self.pool, audit_id, now).await
    }
}

#[async_trait]
impl<D: Dialect> PartitionLeases for SqlStore<D> {
    async fn group_beat(
        &self,
        group_name: &str,
        member: &str,
        now: i64,
        expires: i64,
        forget_before: i64,
    ) -> Result<GroupView, StoreError> {
        group::beat::<D>(&self.pool, group_name, member, now, expires, forget_before).await
    }

    async fn claim_partition(
        &self,
        group_name: &str,
        partition: u32,
        member: &str,
        now: i64,
        expires: i64,
    ) -> Result<bool, StoreError> {
        group::claim::<D>(&self.pool, group_name, partition, member, now, expires).await
    }

    async fn release_partitions(
        &self,
        group_name: &str,
        member: &str,
        partitions: Option<&[u32]>,
        leave: bool,
    ) -> Result<u64, StoreError> {
        group::release::<D>(&self.pool, group_name, member, partitions, leave).await
    }

    async fn group_view(&self, group_name: &str, now: i64) -> Result<GroupView, StoreError> {
        group::group_view::<D>(&self.pool, group_name, now).await
    }
}
