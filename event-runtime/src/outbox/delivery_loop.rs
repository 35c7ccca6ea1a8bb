//! The delivery loop: claims runs while a worker has capacity, delivers the handlers that take
//! the transaction in its own task and the others in tasks of their own, and hands every
//! outcome to the settler. [`Outbox::deliver_batch`], [`Outbox::drain`] and the workers
//! (`workers.rs`) run it, each in its own `Mode`.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_core::ErrorChain;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use super::lease::Lease;
use super::settle::{Decided, Tally};
use super::{BatchReport, Outbox, OutboxError};
use crate::store::backend::{ClaimRequest, ClaimedDelivery};

/// What drives a delivery loop.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// One claim, delivered to the end.
    Once,
    /// Until nothing can progress, or the deadline.
    Drain(Instant),
    /// Until cancelled.
    Worker,
}

impl Outbox {
    /// The delivery loop under `lease`: claims runs while this worker has capacity, delivers
    /// handlers that take the transaction in this task and the others in tasks of their own,
    /// and sends every outcome to a settler that records them as they finish.
    pub(super) async fn delivery_loop(
        &self,
        lease: &Lease,
        mode: Mode,
        cancel: &CancellationToken,
    ) -> Result<BatchReport, OutboxError> {
        let token = lease.token().to_owned();
        let _live = LiveLease::register(self, &token);
        let (settle, outcomes) = mpsc::unbounded_channel();
        let tally = Arc::new(Tally::default());
        let settler = tokio::spawn(self.clone().settler(
            token.clone(),
            outcomes,
            Arc::clone(&tally),
        ));
        let mut run = DeliveryLoop::new(self, lease, &token, mode, cancel, settle);
        let result = run.passes().await;
        // Whatever ended the loop, the runs in flight finish (or give back what they had not
        // started) and every outcome is recorded before the lease goes.
        let mut report = run.finish().await;
        let recorded = settler.await.unwrap_or(false);
        tally.add_to(&mut report);
        result?;
        if !recorded {
            return Err(OutboxError::Unrecorded);
        }
        Ok(report)
    }
}

/// Removes a delivery loop's token from the process's live leases when the loop ends.
struct LiveLease<'a>(&'a Outbox, &'a str);

impl Drop for LiveLease<'_> {
    fn drop(&mut self) {
        self.0
            .inner
            .live_leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| t != self.1);
    }
}

impl<'a> LiveLease<'a> {
    /// Adds `token` to the process's live leases until the guard is dropped.
    fn register(outbox: &'a Outbox, token: &'a str) -> Self {
        outbox
            .inner
            .live_leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(token.to_owned());
        LiveLease(outbox, token)
    }
}

/// One delivery loop between its passes: what it runs under, the runs it started in tasks of
/// their own and what they share, and what it has done so far.
struct DeliveryLoop<'a> {
    outbox: &'a Outbox,
    lease: &'a Lease,
    /// The lease's token: it fences every claim and every outcome of this loop.
    token: &'a str,
    mode: Mode,
    cancel: &'a CancellationToken,
    /// The runs delivered in tasks of their own (outside any transaction).
    external: JoinSet<()>,
    /// This worker's runs outside a transaction at once, across destinations.
    slots: Arc<Semaphore>,
    /// Where those runs send their outcomes: the settler.
    settle: mpsc::UnboundedSender<Decided>,
    /// Runs stop between deliveries when this is cancelled.
    runs_stop: CancellationToken,
    report: BatchReport,
    /// Whether this loop claimed already (`Mode::Once` claims once).
    claimed_once: bool,
    /// When a drain last refreshed the planner statistics.
    last_stats: Instant,
}

impl<'a> DeliveryLoop<'a> {
    /// A loop that has claimed nothing yet, sending its outcomes to `settle`.
    fn new(
        outbox: &'a Outbox,
        lease: &'a Lease,
        token: &'a str,
        mode: Mode,
        cancel: &'a CancellationToken,
        settle: mpsc::UnboundedSender<Decided>,
    ) -> Self {
        DeliveryLoop {
            outbox,
            lease,
            token,
            mode,
            cancel,
            external: JoinSet::new(),
            slots: Arc::new(Semaphore::new(outbox.inner.config.concurrency)),
            settle,
            runs_stop: cancel.child_token(),
            report: BatchReport::default(),
            claimed_once: false,
            last_stats: Instant::now(),
        }
    }

    /// Claims and delivers, pass after pass, until the mode says to stop: `Once` when its one
    /// claim is delivered, `Drain` when nothing can progress (or at its deadline), `Worker`
    /// when cancelled.
    async fn passes(&mut self) -> Result<(), OutboxError> {
        loop {
            self.reap_finished();
            let mut claimed = 0;
            if self.may_claim() {
                self.claimed_once = true;
                claimed = self.claim_and_start().await?;
            }
            self.refresh_statistics_when_due().await?;
            self.outbox.probe_paused().await;
            // Something was due, so more may be: claim again before waiting.
            if claimed > 0 && !matches!(self.mode, Mode::Once) {
                continue;
            }
            if self.wait_for_work().await?.is_break() {
                return Ok(());
            }
        }
    }

    /// Whether this pass claims: not once cancelled, not while every slot of this worker is
    /// taken, and only once in `Mode::Once`.
    fn may_claim(&self) -> bool {
        // Runs in flight or waiting for a permit: claim more only when some finished.
        let capacity = self
            .outbox
            .inner
            .config
            .concurrency
            .saturating_sub(self.external.len());
        !self.cancel.is_cancelled()
            && capacity > 0
            && !(matches!(self.mode, Mode::Once) && self.claimed_once)
    }

    /// Claims due deliveries and starts their runs; returns how many were claimed.
    async fn claim_and_start(&mut self) -> Result<usize, OutboxError> {
        let got = self.claim().await?;
        let claimed = got.len();
        if claimed > 0 {
            self.lease.mark_written();
        }
        self.report.claimed += claimed;
        self.start_runs(got).await?;
        Ok(claimed)
    }

    /// One claim: the circuit breakers' probes that are due, then the due runs of the
    /// destinations this process has not paused. A worker logs a failed claim and tries
    /// again after the poll interval; the other modes fail with it.
    async fn claim(&self) -> Result<Vec<ClaimedDelivery>, OutboxError> {
        let inner = &*self.outbox.inner;
        let destinations: Vec<String> = inner
            .claimable
            .iter()
            .filter(|d| !self.outbox.locally_paused(d))
            .cloned()
            .collect();
        let batch = inner.config.batch_size as usize;
        let now = inner.clock.now_ms();
        let req = ClaimRequest {
            token: self.token,
            owner: self.lease.owner(),
            lease_expires_at: now + inner.config.lease.as_millis() as i64,
            destinations: &destinations,
            max_runs: batch,
            max_deliveries: batch,
            now,
        };
        // The circuit breakers' probes that are due: one delivery each.
        let mut got = self
            .outbox
            .claim_probes(self.token, self.lease.owner())
            .await;
        match inner.store.backend().claim(&req).await {
            Ok(more) => got.extend(more),
            Err(e) if matches!(self.mode, Mode::Worker) => {
                tracing::error!(error = %ErrorChain(&e), "claiming deliveries failed; trying again after the poll interval");
            }
            Err(e) => return Err(e.into()),
        }
        Ok(got)
    }

    /// Starts the runs of claimed deliveries: gives back at once those of destinations this
    /// process does not know, spawns the runs outside a transaction, and delivers the
    /// handlers that take the transaction in this task, in one transaction.
    async fn start_runs(&mut self, got: Vec<ClaimedDelivery>) -> Result<(), OutboxError> {
        let outbox = self.outbox;
        let (mut runs, unknown) = outbox.runs(got);
        outbox.release_now(self.token, &unknown).await?;
        outbox.chain_relay_runs(&mut runs).await;
        let (inline, concurrent): (Vec<_>, Vec<_>) =
            runs.into_iter().partition(|r| !r.dest.is_external());
        for run in concurrent {
            self.external.spawn(outbox.clone().run_external(
                run,
                self.settle.clone(),
                self.runs_stop.clone(),
                Arc::clone(&self.slots),
            ));
        }
        if !inline.is_empty() {
            self.report += outbox
                .run_transactional(inline, self.token, self.cancel)
                .await?;
        }
        Ok(())
    }

    /// Refreshes the planner statistics every 10 s of a drain: a drain runs without the
    /// upkeep task that refreshes them for workers.
    async fn refresh_statistics_when_due(&mut self) -> Result<(), OutboxError> {
        if matches!(self.mode, Mode::Drain(_))
            && self.last_stats.elapsed() >= Duration::from_secs(10)
        {
            self.last_stats = Instant::now();
            self.outbox
                .inner
                .store
                .backend()
                .refresh_statistics()
                .await?;
        }
        Ok(())
    }

    /// After a pass that claimed nothing (or the one pass of `Once`): whether to stop, or
    /// else the wait until more may be due.
    async fn wait_for_work(&mut self) -> Result<ControlFlow<()>, OutboxError> {
        match self.mode {
            Mode::Once => {
                self.join_all().await;
                Ok(ControlFlow::Break(()))
            }
            Mode::Drain(deadline) => self.wait_draining(deadline).await,
            Mode::Worker => Ok(self.wait_idle().await),
        }
    }

    /// A drain stops when nothing of this process's destinations can progress and fails at
    /// its deadline; meanwhile it looks again every 10 ms, or as soon as a run finishes.
    async fn wait_draining(&mut self, deadline: Instant) -> Result<ControlFlow<()>, OutboxError> {
        if !self.external.is_empty() {
            tokio::select! {
                _ = self.external.join_next() => {}
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            return Ok(ControlFlow::Continue(()));
        }
        let inner = &*self.outbox.inner;
        let waiting = inner.store.backend().progressing(&inner.claimable).await?;
        if waiting == 0 {
            return Ok(ControlFlow::Break(()));
        }
        if Instant::now() >= deadline {
            return Err(OutboxError::Timeout { pending: waiting });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(ControlFlow::Continue(()))
    }

    /// A worker stops once cancelled; meanwhile it sleeps until a commit in this process
    /// wakes it, the poll interval passes, or one of its runs finishes (freeing a slot).
    async fn wait_idle(&mut self) -> ControlFlow<()> {
        if self.cancel.is_cancelled() {
            return ControlFlow::Break(());
        }
        let inner = &*self.outbox.inner;
        let wake = inner.wake.notified();
        let poll = tokio::time::sleep(inner.config.poll_interval);
        if self.external.is_empty() {
            tokio::select! {
                _ = wake => {}
                _ = poll => {}
                _ = self.cancel.cancelled() => {}
            }
        } else {
            tokio::select! {
                _ = self.external.join_next() => {}
                _ = wake => {}
                _ = poll => {}
                _ = self.cancel.cancelled() => {}
            }
        }
        ControlFlow::Continue(())
    }

    /// Collects the run tasks that already finished, logging those that failed.
    fn reap_finished(&mut self) {
        while let Some(done) = self.external.try_join_next() {
            log_failed_run(done);
        }
    }

    /// Waits for every run task, logging those that failed.
    async fn join_all(&mut self) {
        while let Some(done) = self.external.join_next().await {
            log_failed_run(done);
        }
    }

    /// Ends the loop: tells the runs in flight to stop between deliveries, waits for them,
    /// and closes the settler's channel. Returns the report of what this task delivered.
    async fn finish(mut self) -> BatchReport {
        self.runs_stop.cancel();
        self.join_all().await;
        // The settler ends once every sender is gone; the runs' own went with their tasks.
        drop(self.settle);
        self.report
    }
}

/// Logs a run task that did not end normally (it panicked or was aborted).
fn log_failed_run(done: Result<(), JoinError>) {
    if let Err(e) = done {
        tracing::error!(error = %e, "a delivery run task failed");
    }
}
