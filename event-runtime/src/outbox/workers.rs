//! Running the engine: the ways to drive the delivery loop (`delivery_loop.rs`: claim runs
//! while capacity allows, deliver them, settle) — one claim ([`Outbox::deliver_batch`]),
//! until idle ([`Outbox::drain`]), or background [`Workers`] that stop with the
//! application's `CancellationToken` — and the upkeep one worker does (retention,
//! statistics, run repair, pauses).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_core::ErrorChain;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::delivery_loop::Mode;
use super::lease::Lease;
use super::{BatchReport, Outbox, OutboxError};

/// How often the upkeep looks for runs whose head was never made ready.
const REPAIR_EVERY: Duration = Duration::from_secs(30);
/// How often the upkeep refreshes planner statistics.
const STATS_EVERY: Duration = Duration::from_secs(5);
/// Purge statements one upkeep pass runs at most (the rest waits for the next pass).
const PURGE_STEPS_PER_PASS: u64 = 100;

impl Outbox {
    /// Claims one set of runs of due deliveries, delivers them, and records the outcomes:
    /// handlers that take the transaction in one transaction with their own writes (a
    /// savepoint each), the others concurrently outside any transaction. Returns what
    /// happened.
    ///
    /// Takes a lease of its own for the call (a row written and deleted).
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the database fails; the claimed deliveries are then
    /// claimed again once this call's lease lapses.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped midway, the lease stops being renewed and the deliveries it
    /// holds run again (at-least-once) once it lapses, after [`OutboxConfig::lease`]; calls
    /// to handlers without a transaction that already ran are repeated then.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    ///
    /// [`OutboxConfig::lease`]: crate::OutboxConfig::lease
    pub async fn deliver_batch(&self) -> Result<BatchReport, OutboxError> {
        let lease = Lease::new(
            &self.inner.store,
            Arc::clone(&self.inner.clock),
            self.inner.config.lease,
        );
        let report = self
            .delivery_loop(&lease, Mode::Once, &CancellationToken::new())
            .await?;
        lease.release().await?;
        Ok(report)
    }

    /// Delivers in this task until no delivery of this process's destinations can make
    /// progress: every one is completed, dead-lettered, waits behind a dead letter of its
    /// (destination, aggregate) (see [`OutboxStats::blocked`](crate::OutboxStats::blocked)),
    /// belongs to a paused destination, or is held: a received event waiting for its
    /// predecessor, which only its arrival (or an accepted gap) releases — so `Ok` does not
    /// mean every received event was handled: ask [`held_events`](Self::held_events).
    /// Waits for scheduled retries. Returns the totals.
    ///
    /// # Errors
    /// [`OutboxError::Store`]; [`OutboxError::Timeout`] when `timeout` passes with deliveries
    /// still pending.
    ///
    /// # Cancel safety
    /// As [`deliver_batch`](Self::deliver_batch).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn drain(&self, timeout: Duration) -> Result<BatchReport, OutboxError> {
        let deadline = Instant::now() + timeout;
        let store = self.inner.store.backend();
        store.refresh_statistics().await?;
        store
            .repair_runs(self.inner.clock.now_ms() - self.expired_leases_ms())
            .await?;
        let lease = Lease::new(
            &self.inner.store,
            Arc::clone(&self.inner.clock),
            self.inner.config.lease,
        );
        let report = self
            .delivery_loop(&lease, Mode::Drain(deadline), &CancellationToken::new())
            .await;
        lease.release().await?;
        report
    }

    /// Starts `count` delivery workers and one upkeep task on the current tokio runtime;
    /// they stop when [`Workers::shutdown`] is called.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_workers(&self, count: usize) -> Workers {
        self.spawn_workers_with(count, CancellationToken::new())
    }

    /// As [`spawn_workers`](Self::spawn_workers), stopping also when `cancel` is cancelled:
    /// pass the application's token so that the outbox shuts down with the rest of the
    /// service (each worker finishes what it is delivering, gives back what it had not
    /// started, records every outcome and releases its lease). [`Workers::wait`] waits for
    /// that.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_workers_with(&self, count: usize, cancel: CancellationToken) -> Workers {
        crate::describe_metrics();
        crate::telemetry::catalog::register_zero(&[
            "events_inbox_gaps_opened_total",
            "events_inbox_invalid_prevsequence_total",
        ]);
        let tracker = TaskTracker::new();
        let tokens: Arc<Mutex<Vec<Option<String>>>> = Arc::new(Mutex::new(vec![None; count]));
        let mut aborts = Vec::with_capacity(count + 1);
        for index in 0..count {
            let outbox = self.clone();
            let cancel = cancel.clone();
            let tokens = Arc::clone(&tokens);
            let h = tracker.spawn(async move { outbox.worker(index, &cancel, &tokens).await });
            aborts.push(h.abort_handle());
        }
        let outbox = self.clone();
        let stop = cancel.clone();
        aborts.push(
            tracker
                .spawn(async move { outbox.upkeep(&stop).await })
                .abort_handle(),
        );
        tracker.close();
        Workers {
            outbox: self.clone(),
            cancel,
            tracker,
            aborts,
            tokens,
        }
    }

    fn expired_leases_ms(&self) -> i64 {
        // Lease rows that lapsed this long ago and hold nothing are deleted.
        (self.inner.config.lease.as_millis() as i64).saturating_mul(10)
    }

    /// One worker: a lease, and the delivery loop under it until cancelled. A loop that
    /// fails lets its lease lapse (its deliveries run again elsewhere) and starts over with a
    /// new one.
    async fn worker(
        &self,
        index: usize,
        cancel: &CancellationToken,
        tokens: &Mutex<Vec<Option<String>>>,
    ) {
        let set = |t: Option<String>| tokens.lock().unwrap_or_else(|e| e.into_inner())[index] = t;
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let lease = Lease::new(
                &self.inner.store,
                Arc::clone(&self.inner.clock),
                self.inner.config.lease,
            );
            set(Some(lease.token().to_owned()));
            match self.delivery_loop(&lease, Mode::Worker, cancel).await {
                Ok(_) => {
                    set(None);
                    if let Err(e) = lease.release().await {
                        tracing::warn!(worker = index, error = %ErrorChain(&e), "giving back a stopping worker's deliveries failed; they run again once its lease lapses");
                    }
                    return;
                }
                Err(e) => {
                    set(None);
                    failures += 1;
                    tracing::error!(worker = index, error = %ErrorChain(&e), "a delivery worker failed; its lease lapses and it starts again with a new one");
                    drop(lease);
                    self.pause_after_failure(failures, cancel).await;
                }
            }
        }
    }

    async fn pause_after_failure(&self, failures: u32, cancel: &CancellationToken) {
        let wait = self.inner.config.poll_interval * failures.min(20);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => {}
        }
    }

    /// The upkeep of one process's workers: the retention purge, backlog gauges, planner
    /// statistics, repairing runs left without a ready head, and probing paused destinations.
    async fn upkeep(&self, cancel: &CancellationToken) {
        let inner = &*self.inner;
        let store = inner.store.backend();
        let mut last_purge = Instant::now();
        let mut last_stats = Instant::now() - STATS_EVERY;
        let mut last_repair = Instant::now() - REPAIR_EVERY;
        // `None`: set the gauges at once (an `Instant` in the past could underflow for a
        // long interval on a host that booted recently).
        let mut last_gauges: Option<Instant> = None;
        let mut gauges = super::gauges::Gauges::default();
        self.report_unregistered().await;
        self.record_catalog_once().await;
        while !cancel.is_cancelled() {
            let now = inner.clock.now_ms();
            if last_repair.elapsed() >= REPAIR_EVERY {
                last_repair = Instant::now();
                match store.repair_runs(now - self.expired_leases_ms()).await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(
                            deliveries = n,
                            "made ready the heads of runs a crash left waiting"
                        );
                        inner.wake.notify_waiters();
                    }
                    Err(e) => tracing::warn!(error = %ErrorChain(&e), "repairing runs failed"),
                }
                // Received events held longer than gap_after for a predecessor: reported.
                if let Err(e) = self.detect_gaps().await {
                    tracing::warn!(error = %ErrorChain(&e), "looking for gaps failed");
                }
            }
            if last_purge.elapsed() >= inner.config.retention_interval {
                last_purge = Instant::now();
                match self.purge(Some(PURGE_STEPS_PER_PASS), cancel).await {
                    Ok(r) if r.deliveries + r.events > 0 => tracing::info!(
                        deliveries = r.deliveries,
                        events = r.events,
                        statements = r.steps,
                        "retention: purged completed deliveries and their events"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %ErrorChain(&e), "retention purge failed"),
                }
            }
            if last_gauges.is_none_or(|t| t.elapsed() >= inner.config.metrics_interval) {
                last_gauges = Some(Instant::now());
                if let Err(e) = gauges.update(self).await {
                    tracing::warn!(error = %ErrorChain(&e), "reading the outbox backlog failed");
                }
            }
            if last_stats.elapsed() >= STATS_EVERY {
                last_stats = Instant::now();
                if let Err(e) = store.refresh_statistics().await {
                    tracing::warn!(error = %ErrorChain(&e), "refreshing outbox statistics failed");
                }
            }
            self.probe_paused().await;
            tokio::select! {
                _ = tokio::time::sleep(inner.config.poll_interval.max(Duration::from_millis(100))) => {}
                _ = cancel.cancelled() => {}
            }
        }
    }
}

/// Running delivery workers. Dropping this handle leaves them running until the token they
/// were started with is cancelled; [`shutdown`](Self::shutdown) stops them.
#[derive(Debug)]
pub struct Workers {
    outbox: Outbox,
    cancel: CancellationToken,
    tracker: TaskTracker,
    aborts: Vec<AbortHandle>,
    tokens: Arc<Mutex<Vec<Option<String>>>>,
}

impl Workers {
    /// The token that stops these workers (cancel it to begin a shutdown without waiting).
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Waits until every worker has stopped (after the token was cancelled).
    ///
    /// # Cancel safety
    /// Cancel safe: the workers go on.
    pub async fn wait(&self) {
        self.tracker.wait().await;
    }

    /// Stops claiming and lets what is in flight finish within `deadline`: each worker
    /// completes the delivery it is running, gives back what it had not started, records
    /// every outcome and releases its lease. Workers still running at the deadline are
    /// aborted — a batch transaction of theirs rolls back, a call to a handler without a
    /// transaction is dropped and runs again (at-least-once) — and their deliveries are given
    /// back so that they are due again at once. Returns how many deliveries aborted workers
    /// gave back.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when giving back fails (the leases then lapse by themselves).
    ///
    /// # Cancel safety
    /// Cancel safe: the workers have been told to stop and go on stopping.
    pub async fn shutdown(self, deadline: Duration) -> Result<u64, OutboxError> {
        self.cancel.cancel();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_ok()
        {
            return Ok(0);
        }
        for a in &self.aborts {
            a.abort();
        }
        self.tracker.wait().await;
        let leftover: Vec<String> = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect();
        let mut released = 0;
        for token in leftover {
            released += self.outbox.inner.store.backend().drop_lease(&token).await?;
        }
        Ok(released)
    }
}
