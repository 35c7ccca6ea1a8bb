//! The delivery engine: runs each run of claimed deliveries (formed in `runs`) — handlers that take
//! the transaction inside one batch transaction (a savepoint each), handlers without one and
//! relays outside any transaction, concurrently across aggregates — and decides each outcome
//! (completed, retry with backoff, dead letter, given back). Recording outcomes is the
//! settler's job; the SQL is the store's.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_core::{AnyEnvelope, DecodeError, ErrorChain, HandlerError, RawEnvelope};
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::breaker::Seen;
use super::destination::{Delivery, DeliveryError, Resolved, Target};
pub(crate) use super::runs::Run;
use super::settle::{Decided, Decision};
use super::text::storable;
use super::{BatchReport, Outbox, OutboxError};
use crate::dispatch::Outcome;
use crate::store::backend::{ClaimedDelivery, SettleOutcome, SettleResult, Settlement};
use crate::store::{DeadLetterReason, Tx};
use crate::telemetry::{Messaging, Operation, SYSTEM_OUTBOX};

/// Why a delivery did not complete.
enum Failure {
    /// It can never be delivered as it is: dead-lettered at once, no attempt used.
    Undeliverable(DeadLetterReason, Vec<String>),
    /// It failed, transiently or permanently.
    Failed(HandlerError),
    /// It panicked (a transient failure).
    Panicked(String),
    /// It ran out of time (a transient failure).
    TimedOut(Duration),
    /// The destination is unavailable: given back, no attempt, destination paused.
    Unavailable(String, Duration),
}

impl Failure {
    /// `error.type` of the failed attempt's span.
    fn error_type(&self) -> &str {
        match self {
            Failure::Undeliverable(reason, _) => reason.as_str(),
            Failure::Failed(e) if e.is_permanent() => "permanent",
            Failure::Failed(_) => "transient",
            Failure::Panicked(_) => "panic",
            Failure::TimedOut(_) => "timeout",
            Failure::Unavailable(..) => "unavailable",
        }
    }
}

impl Failure {
    /// What the destination's circuit breaker makes of it.
    fn seen(&self) -> Seen {
        match self {
            Failure::Failed(e) if e.is_permanent() => Seen::Permanent,
            Failure::Failed(e) => Seen::Transient(e.chain().join(": ")),
            Failure::Panicked(m) => Seen::Transient(format!("handler panicked: {m}")),
            Failure::TimedOut(limit) => Seen::Transient(format!("timed out after {limit:?}")),
            Failure::Undeliverable(..) | Failure::Unavailable(..) => Seen::Inconclusive,
        }
    }
}

impl Outbox {
    /// What a failed attempt leads to — given back without using an attempt when it is this
    /// process's circuit breaker probe and failed transiently — and what its breaker makes of
    /// it.
    fn decide_failure(
        &self,
        span: &tracing::Span,
        dest: &Resolved,
        d: &ClaimedDelivery,
        failure: Failure,
    ) -> (Decision, Seen) {
        let seen = failure.seen();
        if matches!(seen, Seen::Transient(_))
            && self.inner.breakers.is_probe(&dest.name, d.event_id)
        {
            crate::telemetry::failed(span, failure.error_type());
            return (Decision::Release, seen);
        }
        (self.after_failure(span, dest, d, failure), seen)
    }

    /// What a failed attempt leads to: a retry after backoff, or the dead letter queue.
    fn after_failure(
        &self,
        span: &tracing::Span,
        dest: &Resolved,
        d: &ClaimedDelivery,
        failure: Failure,
    ) -> Decision {
        crate::telemetry::failed(span, failure.error_type());
        let attempts = d.attempts.saturating_add(1);
        let now = self.inner.clock.now_ms();
        let (permanent, chain) = match failure {
            Failure::Undeliverable(reason, chain) => {
                return Decision::Dead {
                    attempts: d.attempts,
                    reason,
                    failed_at: now,
                    chain: chain.iter().map(|c| storable(c)).collect(),
                }
            }
            Failure::Failed(e) => (e.is_permanent(), e.chain()),
            Failure::Panicked(m) => (false, vec![format!("handler panicked: {m}")]),
            Failure::TimedOut(limit) => {
                metrics::counter!("events_delivery_timeouts_total", "destination" => dest.name.clone())
                    .increment(1);
                (
                    false,
                    vec![format!(
                        "timed out after {limit:?} (the destination's time limit)"
                    )],
                )
            }
            Failure::Unavailable(..) => {
                unreachable!("handled by the caller")
            }
        };
        let chain: Vec<String> = chain.iter().map(|c| storable(c)).collect();
        metrics::counter!("events_deliveries_failed_total", "destination" => dest.name.clone())
            .increment(1);
        if permanent || attempts >= dest.retry.max_attempts {
            let reason = if permanent {
                DeadLetterReason::Permanent
            } else {
                DeadLetterReason::Exhausted
            };
            return Decision::Dead {
                attempts,
                reason,
                failed_at: now,
                chain,
            };
        }
        let wait = {
            let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
            dest.retry.backoff(attempts, &mut rng)
        };
        // A scheduled retry is the engine doing its job (counted in
        // `events_delivery_retries_total`): info, not warn; giving up is an error.
        tracing::info!(
            event = %d.name,
            event_id = %d.event_id,
            handler = %dest.name,
            attempts,
            retry_in_ms = wait.as_millis() as u64,
            error = %chain.join(": "),
            "delivery failed; will retry"
        );
        metrics::counter!("events_delivery_retries_total", "destination" => dest.name.clone())
            .increment(1);
        Decision::Retry {
            attempts,
            next_attempt_at: now + wait.as_millis() as i64,
            failed_at: now,
            error: chain.join(": "),
        }
    }

    /// Decodes a claimed delivery's envelope for handler `index`, upcast to the version the
    /// handler takes.
    fn decode(&self, d: &ClaimedDelivery, index: u32) -> Result<Box<dyn AnyEnvelope>, Failure> {
        let dead = |reason, chain| Failure::Undeliverable(reason, chain);
        let raw = RawEnvelope::from_json(&d.envelope)
            .map_err(|e| dead(DeadLetterReason::Undecodable, ErrorChain(&e).messages()))?;
        let registry = self.inner.dispatcher.registry();
        let envelope = registry.decode(&raw).map_err(|e| match e {
            DecodeError::UnknownName { .. } | DecodeError::UnknownVersion { .. } => {
                dead(DeadLetterReason::UnknownEvent, ErrorChain(&e).messages())
            }
            e => dead(DeadLetterReason::Undecodable, ErrorChain(&e).messages()),
        })?;
        // The handler's event of that name (one of a union's variants, or its only one).
        let events = self.inner.dispatcher.handler_descriptor(index).events;
        let wanted = events
            .iter()
            .map(|e| e())
            .find(|e| e.name == envelope.name())
            .map(|e| (e.type_id)());
        let Some(wanted) = wanted else {
            let error = format!(
                "handler `{}` does not take `{}` events (its delivery row names an event it \
                 was not routed)",
                self.inner.dispatcher.handler_descriptor(index).name,
                envelope.name()
            );
            return Err(dead(DeadLetterReason::Permanent, vec![error]));
        };
        if envelope.event_type_id() == wanted {
            return Ok(envelope);
        }
        // Recorded before the event's newest version was added: upcast step by step.
        registry
            .upcast(envelope, wanted)
            .map_err(|e| dead(DeadLetterReason::Undecodable, ErrorChain(&e).messages()))
    }

    /// Calls a destination outside any transaction, catching panics.
    async fn call_external(&self, dest: &Resolved, d: &ClaimedDelivery) -> Result<(), Failure> {
        match &dest.target {
            Target::Handler { index, .. } => {
                let envelope = self.decode(d, *index)?;
                match self
                    .inner
                    .dispatcher
                    .call_one(*index, &*envelope, None)
                    .await
                {
                    Outcome::Ran => Ok(()),
                    Outcome::Failed(e) => Err(Failure::Failed(e)),
                    Outcome::Panicked(m) => Err(Failure::Panicked(m.to_string())),
                    other => Err(Failure::Failed(HandlerError::transient_msg(other))),
                }
            }
            Target::External(destination) => {
                let delivery = Delivery {
                    event_id: d.event_id,
                    name: &d.name,
                    version: d.version,
                    aggregate_type: &d.aggregate_type,
                    aggregate_id: &d.aggregate_id,
                    sequence: d.sequence,
                    attempt: d.attempts.saturating_add(1),
                    envelope: &d.envelope,
                    previous_sequence: d.relay_previous,
                };
                match AssertUnwindSafe(destination.deliver(&delivery))
                    .catch_unwind()
                    .await
                {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(DeliveryError::Failed(e))) => Err(Failure::Failed(e)),
                    Ok(Err(DeliveryError::Unavailable {
                        reason,
                        retry_after,
                    })) => Err(Failure::Unavailable(reason, retry_after)),
                    Err(payload) => Err(Failure::Panicked(
                        crate::dispatch::dispatcher::panic_message(&*payload),
                    )),
                }
            }
        }
    }

    /// Delivers one run of a destination that takes no transaction, in order, each within
    /// its time limit, stopping at the first failure; every outcome goes to the settler as
    /// soon as it is known. Deliveries not attempted are given back.
    pub(crate) async fn run_external(
        self,
        run: Run,
        settle: mpsc::UnboundedSender<Decided>,
        stop: CancellationToken,
        slots: Arc<tokio::sync::Semaphore>,
    ) {
        let dest = run.dest;
        // A slot of the worker, then one of the destination (its own limit in this process).
        let _slot = slots.acquire_owned().await;
        let _permit = Arc::clone(&dest.permits).acquire_owned().await;
        let mut rest = run.deliveries.into_iter();
        while let Some(d) = rest.next() {
            if stop.is_cancelled() || self.locally_paused(&dest.name) {
                give_back(&settle, std::iter::once(d).chain(rest));
                return;
            }
            let span = delivery_span(&dest, &d);
            let started = Instant::now();
            let result = tokio::time::timeout(dest.timeout, self.call_external(&dest, &d))
                .instrument(span.clone())
                .await
                .unwrap_or(Err(Failure::TimedOut(dest.timeout)));
            let (decision, seen) = match result {
                Ok(()) => (
                    Decision::Completed {
                        attempts: d.attempts.saturating_add(1),
                        elapsed: started.elapsed(),
                    },
                    Seen::Success,
                ),
                Err(Failure::Unavailable(reason, retry_after)) => {
                    crate::telemetry::failed(&span, "unavailable");
                    self.pause_unavailable(&dest, &reason, retry_after).await;
                    give_back(&settle, std::iter::once(d).chain(rest));
                    return;
                }
                Err(failure) => self.decide_failure(&span, &dest, &d, failure),
            };
            self.breaker_observe(&dest, d.event_id, &seen).await;
            let completed = matches!(decision, Decision::Completed { .. });
            let _ = settle.send(Decided::new(&dest.name, d, decision));
            if !completed {
                give_back(&settle, rest);
                return;
            }
        }
    }

    /// Delivers runs of handlers that take the transaction, in one batch transaction: each
    /// delivery in a savepoint, its completion recorded (fenced by the lease token) in the
    /// same savepoint, so that its writes and the record that it ran commit together, and a
    /// delivery another worker took over is undone alone.
    pub(crate) async fn run_transactional(
        &self,
        runs: Vec<Run>,
        token: &str,
        stop: &CancellationToken,
    ) -> Result<BatchReport, OutboxError> {
        let inner = &*self.inner;
        let mut report = BatchReport::default();
        let mut tx = inner.store.begin().await?;
        let mut completed: Vec<(String, Duration)> = Vec::new();
        let mut released: Vec<ClaimedDelivery> = Vec::new();
        // What the circuit breakers decided: written once the batch transaction has ended.
        let mut breaker = Vec::new();
        for run in &runs {
            let dest = &*run.dest;
            let Target::Handler { index, .. } = dest.target else {
                unreachable!("only handlers take the transaction")
            };
            for (i, d) in run.deliveries.iter().enumerate() {
                if stop.is_cancelled() || self.inner.breakers.is_open(&dest.name) {
                    released.extend(run.deliveries[i..].iter().cloned());
                    break;
                }
                self.renew_live_leases(&mut tx).await?;
                let started = Instant::now();
                let mut seen = Seen::Inconclusive;
                let step = self
                    .deliver_in_tx(&mut tx, dest, index, d, token, &mut seen)
                    .instrument(delivery_span(dest, d))
                    .await?;
                if let Some(action) = self.inner.breakers.observe(dest, d.event_id, &seen) {
                    breaker.push((Arc::clone(&run.dest), action));
                }
                match step {
                    InTx::Completed => {
                        report.completed += 1;
                        completed.push((dest.name.clone(), started.elapsed()));
                    }
                    InTx::LeaseLost => {
                        report.lease_lost += 1;
                        break;
                    }
                    InTx::Conflict => {
                        // A deadlock or serialization failure between this batch and another
                        // transaction: the batch's locks are part of the cycle, so retrying
                        // the one delivery inside it would meet the same cycle. Undo the
                        // whole batch and give the deliveries back, due at once and without
                        // using an attempt.
                        tx.rollback().await?;
                        self.breaker_apply_all(breaker).await;
                        let all: Vec<_> = runs.iter().flat_map(|r| r.deliveries.clone()).collect();
                        self.release_now(token, &all).await?;
                        tracing::warn!("delivery batch rolled back after a database conflict");
                        let claimed = all.len();
                        return Ok(BatchReport {
                            claimed,
                            conflicts: claimed,
                            ..BatchReport::default()
                        });
                    }
                    InTx::Failed(dead) => {
                        if dead {
                            report.dead_lettered += 1;
                        } else {
                            report.retried += 1;
                        }
                        released.extend(run.deliveries[i + 1..].iter().cloned());
                        break;
                    }
                }
                tx = fault!(self, DuringHandler, tx);
            }
        }
        let mut tx = fault!(self, AfterHandler, tx);
        // The lock this transaction held kept every renewal of this process waiting: renew
        // before letting go of it, so that no other worker finds a live worker's lease lapsed.
        self.renew_live_leases(&mut tx).await?;
        if !released.is_empty() {
            let now = inner.clock.now_ms();
            let batch: Vec<Settlement<'_>> = released
                .iter()
                .map(|d| settlement(&d.destination, d, SettleOutcome::Release))
                .collect();
            tx.backend().settle(token, now, &batch).await?;
        }
        let committed = tx.commit().await;
        self.breaker_apply_all(breaker).await;
        if let Err(e) = committed {
            // Nothing of the batch was kept. Count one failed attempt for the head of each
            // run, so that a batch whose commit always fails (a deferred constraint one of its
            // handlers breaks) ends in the dead letter queue instead of looping.
            self.commit_failed(&runs, token, &e).await;
            return Err(e.into());
        }
        for (handler, elapsed) in completed {
            metrics::counter!("events_deliveries_completed_total", "destination" => handler.clone())
                .increment(1);
            metrics::histogram!("events_delivery_duration_seconds", "destination" => handler)
                .record(elapsed.as_secs_f64());
        }
        Ok(report)
    }

    /// Where writers are serialised (SQLite), the batch transaction holds the only write
    /// lock and this process's other workers cannot renew their leases: renew them here.
    async fn renew_live_leases(&self, tx: &mut Tx) -> Result<(), OutboxError> {
        let tokens = self
            .inner
            .live_leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let until = self.inner.clock.now_ms() + self.inner.config.lease.as_millis() as i64;
        tx.backend().renew_leases(&tokens, until).await?;
        Ok(())
    }

    async fn deliver_in_tx(
        &self,
        tx: &mut Tx,
        dest: &Resolved,
        index: u32,
        d: &ClaimedDelivery,
        token: &str,
        seen: &mut Seen,
    ) -> Result<InTx, OutboxError> {
        const SAVEPOINT: &str = "event_delivery";
        let envelope = match self.decode(d, index) {
            Ok(e) => e,
            Err(failure) => {
                let (decision, _) =
                    self.decide_failure(&tracing::Span::current(), dest, d, failure);
                return self
                    .settle_failure_in_tx(tx, dest, d, decision, token)
                    .await;
            }
        };
        // The limit first: a rollback to the savepoint would undo a limit set inside it.
        tx.backend().set_time_limit(Some(dest.timeout)).await?;
        tx.backend().savepoint(SAVEPOINT).await?;
        let outcome = tokio::time::timeout(
            dest.timeout,
            self.inner
                .dispatcher
                .call_one(index, &*envelope, Some(&mut *tx)),
        )
        .await;
        // A deadline (SQLite) must not stop the bookkeeping that follows a success. After a
        // failure or a timeout it stays until the rollback to the savepoint: a statement the
        // dropped handler left running is stopped by it, not waited for.
        let lifted = match outcome {
            Ok(Outcome::Ran) => Some(tx.backend().set_time_limit(None).await),
            _ => None,
        };
        let failure = match outcome {
            Ok(Outcome::Ran) if matches!(lifted, Some(Ok(_))) => {
                let now = self.inner.clock.now_ms();
                let done = SettleOutcome::Completed {
                    attempts: d.attempts.saturating_add(1),
                };
                let r = tx
                    .backend()
                    .complete(token, now, &settlement(&dest.name, d, done))
                    .await;
                match r {
                    Ok(SettleResult::Settled) => {
                        tx.backend().release_savepoint(SAVEPOINT).await?;
                        *seen = Seen::Success;
                        return Ok(InTx::Completed);
                    }
                    Ok(SettleResult::LeaseLost) => {
                        // Another worker took this delivery over: undo this run's effects.
                        tx.backend().rollback_to_savepoint(SAVEPOINT).await?;
                        tx.backend().release_savepoint(SAVEPOINT).await?;
                        tracing::warn!(event_id = %d.event_id, handler = %dest.name, "delivery taken over by another worker; its effects here were undone");
                        metrics::counter!("events_delivery_lease_lost_total", "destination" => dest.name.clone()).increment(1);
                        return Ok(InTx::LeaseLost);
                    }
                    Ok(SettleResult::Failed(e)) | Err(e) => Failure::Failed(
                        HandlerError::transient(StoreFailure("recording the completion", e)),
                    ),
                }
            }
            Ok(Outcome::Failed(e)) if self.inner.store.backend().is_conflict(e.source_error()) => {
                tx.backend().rollback_to_savepoint(SAVEPOINT).await?;
                return Ok(InTx::Conflict);
            }
            Ok(Outcome::Failed(e)) => Failure::Failed(e),
            Ok(Outcome::Panicked(m)) => Failure::Panicked(m.to_string()),
            Ok(Outcome::Ran) => Failure::Failed(HandlerError::transient_msg(
                "lifting the statement time limit after the handler failed",
            )),
            Ok(other) => Failure::Failed(HandlerError::transient_msg(other)),
            Err(_) => Failure::TimedOut(dest.timeout),
        };
        // Undo the handler's writes; the failure is recorded outside its savepoint.
        undo(tx, SAVEPOINT).await?;
        tx.backend().release_savepoint(SAVEPOINT).await?;
        tx.backend().set_time_limit(None).await?;
        let (decision, failed) = self.decide_failure(&tracing::Span::current(), dest, d, failure);
        *seen = failed;
        self.settle_failure_in_tx(tx, dest, d, decision, token)
            .await
    }

    async fn settle_failure_in_tx(
        &self,
        tx: &mut Tx,
        dest: &Resolved,
        d: &ClaimedDelivery,
        decision: Decision,
        token: &str,
    ) -> Result<InTx, OutboxError> {
        let dead = matches!(decision, Decision::Dead { .. });
        let decided = Decided::new(&dest.name, d.clone(), decision);
        log_dead_letter(&decided);
        let now = self.inner.clock.now_ms();
        let r = tx
            .backend()
            .settle(token, now, &[decided.settlement()])
            .await?;
        Ok(match r.into_iter().next() {
            Some(SettleResult::LeaseLost) => InTx::LeaseLost,
            _ => InTx::Failed(dead),
        })
    }

    /// Gives deliveries back outside any transaction.
    pub(crate) async fn release_now(
        &self,
        token: &str,
        deliveries: &[ClaimedDelivery],
    ) -> Result<(), OutboxError> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let batch: Vec<Settlement<'_>> = deliveries
            .iter()
            .map(|d| settlement(&d.destination, d, SettleOutcome::Release))
            .collect();
        let now = self.inner.clock.now_ms();
        self.inner
            .store
            .backend()
            .settle(token, now, &batch)
            .await?;
        Ok(())
    }

    async fn commit_failed(&self, runs: &[Run], token: &str, error: &crate::store::StoreError) {
        tracing::error!(error = %ErrorChain(error), "committing a delivery batch failed; nothing of it was kept");
        let message = format!(
            "committing the delivery batch failed: {}",
            ErrorChain(error)
        );
        let mut decided = Vec::new();
        for run in runs {
            let mut rest = run.deliveries.iter();
            if let Some(head) = rest.next() {
                let failure = Failure::Failed(HandlerError::transient_msg(&message));
                let decision = self.after_failure(&tracing::Span::none(), &run.dest, head, failure);
                decided.push(Decided::new(&run.dest.name, head.clone(), decision));
            }
            for d in rest {
                decided.push(Decided::new(&run.dest.name, d.clone(), Decision::Release));
            }
        }
        let batch: Vec<Settlement<'_>> = decided.iter().map(Decided::settlement).collect();
        let now = self.inner.clock.now_ms();
        if let Err(e) = self.inner.store.backend().settle(token, now, &batch).await {
            tracing::error!(error = %ErrorChain(&e), "recording the failed batch failed too; its leases lapse and it is claimed again");
        }
    }
}

/// A store failure while recording an outcome, as a handler error's cause.
#[derive(Debug, thiserror::Error)]
#[error("{0} failed")]
struct StoreFailure(&'static str, #[source] crate::store::StoreError);

/// What one delivery inside the batch transaction came to.
enum InTx {
    Completed,
    LeaseLost,
    Conflict,
    /// Failed and recorded: dead-lettered (`true`) or to be retried.
    Failed(bool),
}

/// Rolls back to `savepoint` after a failed or timed-out handler. The first try may return
/// the error of the statement the dropped handler left running (PostgreSQL reports its
/// cancellation by `statement_timeout` to the next command on the connection): try again.
async fn undo(tx: &mut Tx, savepoint: &str) -> Result<(), crate::store::StoreError> {
    match tx.backend().rollback_to_savepoint(savepoint).await {
        Ok(()) => Ok(()),
        Err(_) => tx.backend().rollback_to_savepoint(savepoint).await,
    }
}

fn give_back(settle: &mpsc::UnboundedSender<Decided>, rest: impl Iterator<Item = ClaimedDelivery>) {
    for d in rest {
        let name = d.destination.clone();
        let _ = settle.send(Decided::new(&name, d, Decision::Release));
    }
}

pub(crate) fn settlement<'a>(
    destination: &'a str,
    d: &'a ClaimedDelivery,
    outcome: SettleOutcome<'a>,
) -> Settlement<'a> {
    Settlement {
        destination,
        event_id: d.event_id,
        aggregate_type: &d.aggregate_type,
        aggregate_id: &d.aggregate_id,
        sequence: d.sequence,
        outcome,
        relay_previous: d.relay_previous,
    }
}

/// The span of one attempt of a delivery: `process {destination}` (CONSUMER) of the
/// OpenTelemetry messaging conventions, a child of the event's creation context and linked to
/// it, so that every attempt — a retry hours later too — joins the trace of the command that
/// recorded the event, each attempt a sibling of the others.
fn delivery_span(dest: &Resolved, d: &ClaimedDelivery) -> tracing::Span {
    let span = tracing::info_span!(
        "delivery",
        event = %d.name,
        event_id = %d.event_id,
        handler = %dest.name,
        attempt = d.attempts.saturating_add(1),
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    crate::telemetry::describe(
        &span,
        Messaging::new(Operation::Process, SYSTEM_OUTBOX, &dest.name)
            .message(d.event_id)
            .group(&dest.name),
        Some(&d.envelope),
        true,
    );
    span
}

/// Logs a dead letter decision, with its metric.
pub(crate) fn log_dead_letter(d: &Decided) {
    if let Decision::Dead {
        attempts,
        reason,
        chain,
        ..
    } = &d.decision
    {
        metrics::counter!("events_deliveries_dead_lettered_total", "destination" => d.destination.clone())
            .increment(1);
        tracing::error!(
            event = %d.delivery.name,
            event_id = %d.delivery.event_id,
            handler = %d.destination,
            reason = %reason,
            attempts,
            error = %chain.join(": "),
            "delivery dead-lettered"
        );
    }
}
