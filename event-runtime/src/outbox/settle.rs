//! The settler: records the outcomes of deliveries made outside any transaction, as they
//! finish, in short transactions that each take every outcome finished meanwhile (a group
//! commit). An outcome is never dropped: a refused batch is tried again, and a worker that
//! gives up lets the lease lapse so the delivery runs again (at-least-once).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_core::ErrorChain;
use tokio::sync::mpsc;

use super::engine::{log_dead_letter, settlement};
use super::{BatchReport, Outbox};
use crate::store::backend::{ClaimedDelivery, SettleOutcome, SettleResult, Settlement};
use crate::store::DeadLetterReason;

/// Outcomes recorded in one transaction, at most.
const MAX_BATCH: usize = 1_000;

/// What the engine decided for one claimed delivery.
pub(crate) enum Decision {
    Completed {
        attempts: u32,
        elapsed: Duration,
    },
    Retry {
        attempts: u32,
        next_attempt_at: i64,
        /// When the attempt failed (ms): the retry's backoff counts from it.
        failed_at: i64,
        error: String,
    },
    Dead {
        attempts: u32,
        reason: DeadLetterReason,
        failed_at: i64,
        chain: Vec<String>,
    },
    /// Not attempted: given back.
    Release,
}

/// A decision with the delivery it is for.
pub(crate) struct Decided {
    pub(crate) destination: String,
    pub(crate) delivery: ClaimedDelivery,
    pub(crate) decision: Decision,
}

impl Decided {
    pub(crate) fn new(destination: &str, delivery: ClaimedDelivery, decision: Decision) -> Self {
        Decided {
            destination: destination.to_owned(),
            delivery,
            decision,
        }
    }

    pub(crate) fn settlement(&self) -> Settlement<'_> {
        let outcome = match &self.decision {
            Decision::Completed { attempts, .. } => SettleOutcome::Completed {
                attempts: *attempts,
            },
            Decision::Retry {
                attempts,
                next_attempt_at,
                failed_at,
                error,
            } => SettleOutcome::Retry {
                attempts: *attempts,
                next_attempt_at: *next_attempt_at,
                failed_at: *failed_at,
                error,
            },
            Decision::Dead {
                attempts,
                reason,
                failed_at,
                chain,
            } => SettleOutcome::Dead {
                attempts: *attempts,
                reason: reason.as_str(),
                failed_at: *failed_at,
                chain,
            },
            Decision::Release => SettleOutcome::Release,
        };
        settlement(&self.destination, &self.delivery, outcome)
    }
}

/// Running totals of what a settler recorded.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    completed: AtomicUsize,
    retried: AtomicUsize,
    dead_lettered: AtomicUsize,
    lease_lost: AtomicUsize,
}

impl Tally {
    pub(crate) fn add_to(&self, report: &mut BatchReport) {
        report.completed += self.completed.swap(0, Ordering::Relaxed);
        report.retried += self.retried.swap(0, Ordering::Relaxed);
        report.dead_lettered += self.dead_lettered.swap(0, Ordering::Relaxed);
        report.lease_lost += self.lease_lost.swap(0, Ordering::Relaxed);
    }
}

impl Outbox {
    /// Records the outcomes sent on `rx` under lease `token` until every sender is gone and
    /// everything is recorded. Returns false when it gave up on some (the database kept
    /// refusing them): their lease must be left to lapse, not released.
    pub(crate) async fn settler(
        self,
        token: String,
        mut rx: mpsc::UnboundedReceiver<Decided>,
        tally: Arc<Tally>,
    ) -> bool {
        let mut pending: Vec<(Decided, u32)> = Vec::new();
        let mut all_recorded = true;
        let mut failures = 0u32;
        loop {
            if pending.is_empty() {
                match rx.recv().await {
                    Some(d) => pending.push((d, 0)),
                    None => return all_recorded,
                }
            }
            while pending.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(d) => pending.push((d, 0)),
                    Err(_) => break,
                }
            }
            let take = pending.len().min(MAX_BATCH);
            let batch: Vec<(Decided, u32)> = pending.drain(..take).collect();
            let settlements: Vec<Settlement<'_>> =
                batch.iter().map(|(d, _)| d.settlement()).collect();
            let now = self.inner.clock.now_ms();
            let results = self
                .inner
                .store
                .backend()
                .settle(&token, now, &settlements)
                .await;
            drop(settlements);
            match results {
                Ok(results) => {
                    failures = 0;
                    for ((d, tries), r) in batch.into_iter().zip(results) {
                        match r {
                            SettleResult::Settled => self.recorded(&d, &tally),
                            SettleResult::LeaseLost => {
                                tally.lease_lost.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(event_id = %d.delivery.event_id, handler = %d.destination, "delivery taken over by another worker before its outcome was recorded; it runs again there");
                                metrics::counter!("events_delivery_lease_lost_total", "destination" => d.destination.clone()).increment(1);
                            }
                            SettleResult::Failed(e) if tries < 3 => {
                                tracing::warn!(event_id = %d.delivery.event_id, handler = %d.destination, error = %ErrorChain(&e), "recording a delivery's outcome failed; trying again");
                                pending.push((d, tries + 1));
                            }
                            SettleResult::Failed(e) => {
                                all_recorded = false;
                                tracing::error!(event_id = %d.delivery.event_id, handler = %d.destination, error = %ErrorChain(&e), "recording a delivery's outcome failed for good; it runs again once this worker's lease lapses");
                            }
                        }
                    }
                }
                Err(e) => {
                    failures += 1;
                    let wait = Duration::from_millis(100 * u64::from(failures.min(50)));
                    tracing::warn!(error = %ErrorChain(&e), outcomes = batch.len(), retry_in_ms = wait.as_millis() as u64, "recording delivery outcomes failed; trying again");
                    let mut again = batch;
                    again.append(&mut pending);
                    pending = again;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    fn recorded(&self, d: &Decided, tally: &Tally) {
        let handler = &d.destination;
        match &d.decision {
            Decision::Completed { elapsed, .. } => {
                tally.completed.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("events_deliveries_completed_total", "destination" => handler.clone())
                    .increment(1);
                metrics::histogram!("events_delivery_duration_seconds", "destination" => handler.clone())
                    .record(elapsed.as_secs_f64());
            }
            Decision::Retry { .. } => {
                tally.retried.fetch_add(1, Ordering::Relaxed);
            }
            Decision::Dead { .. } => {
                tally.dead_lettered.fetch_add(1, Ordering::Relaxed);
                log_dead_letter(d);
            }
            Decision::Release => {}
        }
    }
}
