//! The in-memory unit of work: collects the events of one command and commits them in two
//! phases (in-transaction handlers, then after-commit handlers). No database here.

use event_core::{AnyEnvelope, DeliveryMode, DomainEvent, Envelope, HandlerError};
use uuid::Uuid;

use crate::dispatch::dispatcher::{Dispatcher, Phase};
use crate::dispatch::report::{DispatchReport, Outcome};

/// A commit was aborted because an `in_transaction` handler failed. No after-commit handler
/// ran for any event of the unit of work.
#[derive(Debug, thiserror::Error)]
#[error("commit aborted: in-transaction handler `{handler}` of `{event_name}` (event {event_id}) {reason}")]
pub struct CommitError {
    /// The handler that failed.
    pub handler: &'static str,
    /// The event it was handling.
    pub event_name: &'static str,
    /// The event id.
    pub event_id: Uuid,
    /// `failed (transient)`, `failed (permanent)` (the handler's error is the
    /// [`source`](std::error::Error::source)), or `panicked: …` with the panic message.
    pub reason: String,
    /// The handler's error, when it returned one (rather than panicking).
    #[source]
    pub error: Option<HandlerErrorSource>,
}

impl CommitError {
    /// `Ok(report)` when every in-transaction handler in it succeeded; otherwise the error for
    /// the first that failed or panicked.
    pub(crate) fn check(
        mut report: DispatchReport,
        envelope: &dyn AnyEnvelope,
    ) -> Result<DispatchReport, CommitError> {
        let Some((handler, outcome)) = report.take_first_failure() else {
            return Ok(report);
        };
        let (reason, error) = match outcome {
            Outcome::Failed(e) => {
                let kind = if e.is_permanent() {
                    "permanent"
                } else {
                    "transient"
                };
                (format!("failed ({kind})"), Some(HandlerErrorSource(e)))
            }
            other => (other.to_string(), None),
        };
        Err(CommitError {
            handler,
            event_name: envelope.name(),
            event_id: envelope.metadata().id,
            reason,
            error,
        })
    }
}

/// A [`HandlerError`] as a `std::error::Error` source: it stands for the error the handler
/// returned, displays as that error and has its sources, so that an error chain prints each
/// cause once (the kind, transient or permanent, is in [`CommitError::reason`]).
#[derive(Debug)]
pub struct HandlerErrorSource(pub HandlerError);

impl std::fmt::Display for HandlerErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self.0.source_error(), f)
    }
}

impl std::error::Error for HandlerErrorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source_error().source()
    }
}

/// The events of one command, committed together.
///
/// [`commit`](Self::commit) runs, for every event in order, the `in_transaction` handlers;
/// when one fails or panics the commit is aborted and no other handler runs. Then it runs the
/// after-commit handlers of every event. This in-memory unit of work has no database to roll
/// back: effects an in-transaction handler made on its resources before another one failed
/// stay made. The store-backed unit of work runs the same phases inside a real transaction.
///
/// ```
/// # use event_core::{DomainEvent, EventRecorder};
/// # use event_runtime::Dispatcher;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, DomainEvent)]
/// # #[event(name = "user.registered", version = 1)]
/// # struct Registered { #[event(aggregate_id)] user: String }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dispatcher = Dispatcher::builder().build().unwrap();
/// let mut recorder = EventRecorder::new();
/// recorder.record(Registered { user: "ada".into() });
/// let mut uow = dispatcher.unit_of_work();
/// uow.extend(recorder.take());
/// let reports = uow.commit().await.unwrap();
/// assert_eq!(reports.len(), 1);
/// # });
/// ```
#[derive(Debug)]
pub struct UnitOfWork<'d> {
    dispatcher: &'d Dispatcher,
    pending: Vec<Box<dyn AnyEnvelope>>,
}

impl<'d> UnitOfWork<'d> {
    pub(crate) fn new(dispatcher: &'d Dispatcher) -> Self {
        UnitOfWork {
            dispatcher,
            pending: Vec::new(),
        }
    }

    /// Adds one envelope.
    pub fn add<E: DomainEvent>(&mut self, envelope: Envelope<E>) {
        self.pending.push(Box::new(envelope));
    }

    /// Adds envelopes taken from a recorder.
    pub fn extend(&mut self, envelopes: impl IntoIterator<Item = Box<dyn AnyEnvelope>>) {
        self.pending.extend(envelopes);
    }

    /// The envelopes added so far.
    pub fn pending(&self) -> &[Box<dyn AnyEnvelope>] {
        &self.pending
    }

    /// Commits: in-transaction handlers of every event, then after-commit handlers of every
    /// event. Returns one report per event, in order, with both phases' outcomes.
    ///
    /// # Errors
    /// [`CommitError`] when an in-transaction handler failed or panicked; nothing after it ran.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped part-way, the handlers that ran keep their effects (this unit
    /// of work is in memory and has no transaction to roll back) and the rest do not run.
    pub async fn commit(self) -> Result<Vec<DispatchReport>, CommitError> {
        let mut reports = Vec::with_capacity(self.pending.len());
        for envelope in &self.pending {
            let report = self
                .dispatcher
                .dispatch_phase(&**envelope, Phase::Only(DeliveryMode::InTransaction), None)
                .await;
            reports.push(CommitError::check(report, &**envelope)?);
        }
        for (envelope, report) in self.pending.iter().zip(&mut reports) {
            let after = self
                .dispatcher
                .dispatch_phase(&**envelope, Phase::Only(DeliveryMode::AfterCommit), None)
                .await;
            report.merge(after);
        }
        Ok(reports)
    }
}
