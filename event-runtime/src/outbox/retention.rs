//! Retention: completed deliveries, and the events nothing refers to any more, are deleted
//! once they are older than [`OutboxConfig::retention`](crate::OutboxConfig::retention), in
//! bounded statements (each its own short transaction, so deliveries keep flowing and the
//! SQLite write lock is released between them), by one purger at a time across processes.

use tokio_util::sync::CancellationToken;

use super::{Outbox, OutboxError};

/// What a retention purge deleted ([`Outbox::purge_expired`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Completed deliveries deleted.
    pub deliveries: u64,
    /// Outbox rows (events) deleted.
    pub events: u64,
    /// Statements run, each deleting at most
    /// [`OutboxConfig::retention_batch`](crate::OutboxConfig::retention_batch) rows of each
    /// table in a transaction of its own.
    pub steps: u64,
    /// Another process was purging: this one stopped without deleting.
    pub busy: bool,
    /// Chain rows deleted: relay chains of aggregates that published nothing within the
    /// retention window, and the released places of received aggregates idle that long
    /// (their next event starts a new chain).
    pub chains: u64,
}

impl Outbox {
    /// Deletes what is older than the retention now, in bounded steps, until nothing older
    /// is left (workers also do this every
    /// [`OutboxConfig::retention_interval`](crate::OutboxConfig::retention_interval)).
    ///
    /// Deletes deliveries completed more than
    /// [`OutboxConfig::retention`](crate::OutboxConfig::retention) ago by the outbox's
    /// [`Clock`](crate::Clock), then the events recorded before then that no delivery and no
    /// open dead letter refers to. Never touches a pending, leased or dead delivery, an open
    /// dead letter, or its event.
    ///
    /// The retention is the outbox's **de-duplication window**: an event id is skipped at
    /// commit only while its outbox row exists, so an event committed again after its row
    /// was purged is delivered again.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when a statement fails; the steps before it stay done.
    ///
    /// # Cancel safety
    /// Cancel safe: each step commits alone; dropped between steps, what was deleted stays
    /// deleted and the rest waits for the next purge.
    pub async fn purge_expired(&self) -> Result<PurgeReport, OutboxError> {
        self.purge(None, &CancellationToken::new()).await
    }

    /// Purges in at most `max_steps` steps (all, `None`), stopping early on `cancel`.
    pub(crate) async fn purge(
        &self,
        max_steps: Option<u64>,
        cancel: &CancellationToken,
    ) -> Result<PurgeReport, OutboxError> {
        let inner = &*self.inner;
        let batch = inner.config.retention_batch;
        let cutoff = inner.clock.now_ms() - inner.config.retention.as_millis() as i64;
        let mut report = PurgeReport::default();
        while max_steps.is_none_or(|max| report.steps < max) && !cancel.is_cancelled() {
            let step = inner.store.backend().purge_completed(cutoff, batch).await?;
            report.steps += 1;
            if step.busy {
                report.busy = true;
                break;
            }
            report.deliveries += step.deliveries;
            report.events += step.events;
            if step.deliveries < u64::from(batch) && step.events < u64::from(batch) {
                break;
            }
            // Let the deliveries between two steps through.
            tokio::task::yield_now().await;
        }
        if !report.busy && !cancel.is_cancelled() {
            report.chains = inner
                .store
                .backend()
                .purge_chains(cutoff, batch as usize)
                .await?;
        }
        Ok(report)
    }
}
