//! What a dispatch reports: one outcome per handler. Plain data, no behaviour.

use std::fmt;

use event_core::HandlerError;
use smallvec::SmallVec;
use uuid::Uuid;

/// What happened to one handler of one event.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded.
    Ran,
    /// Skipped: the idempotency guard has seen (handler, event id) already.
    Duplicate,
    /// The handler returned an error. Not marked in the guard, so a retry runs it again.
    Failed(HandlerError),
    /// The handler panicked; the message is the panic payload. Treated as a failure.
    Panicked(PanicMessage),
}

/// The message of a handler's panic (the `&str` or `String` payload of `panic!`).
#[derive(Debug, Clone, PartialEq, Eq)]
// One pointer rather than `String`'s three, so that `Outcome` and a report stay small; the
// extra allocation is paid only when a handler panics.
#[allow(clippy::box_collection)]
pub struct PanicMessage(Box<String>);

impl PanicMessage {
    pub(crate) fn new(message: String) -> Self {
        PanicMessage(Box::new(message))
    }

    /// The message.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PanicMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for PanicMessage {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Outcome {
    /// `true` for [`Outcome::Failed`] and [`Outcome::Panicked`].
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failed(_) | Outcome::Panicked(_))
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ran => f.write_str("ran"),
            Outcome::Duplicate => f.write_str("skipped as duplicate"),
            Outcome::Failed(e) => write!(f, "failed: {e}"),
            Outcome::Panicked(m) => write!(f, "panicked: {m}"),
        }
    }
}

/// One handler's outcome.
#[derive(Debug)]
pub struct HandlerOutcome {
    /// The handler name (its idempotency key).
    pub handler: &'static str,
    /// What happened.
    pub outcome: Outcome,
}

/// The outcome of dispatching one event: one entry per handler, in the order they ran.
#[derive(Debug)]
pub struct DispatchReport {
    pub(crate) event_id: Uuid,
    pub(crate) event_name: &'static str,
    pub(crate) outcomes: SmallVec<[HandlerOutcome; 4]>,
}

impl DispatchReport {
    /// The event id.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// The event name.
    pub fn event_name(&self) -> &'static str {
        self.event_name
    }

    /// Every handler's outcome, in the order they ran.
    pub fn outcomes(&self) -> &[HandlerOutcome] {
        &self.outcomes
    }

    /// The outcome of the handler named `handler`.
    pub fn outcome(&self, handler: &str) -> Option<&Outcome> {
        self.outcomes
            .iter()
            .find(|o| o.handler == handler)
            .map(|o| &o.outcome)
    }

    /// How many handlers ran and succeeded.
    pub fn ran(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Ran))
    }

    /// How many handlers were skipped as duplicates.
    pub fn duplicates(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Duplicate))
    }

    /// How many handlers failed or panicked.
    pub fn failures(&self) -> usize {
        self.count(Outcome::is_failure)
    }

    /// `true` when no handler failed or panicked.
    pub fn is_success(&self) -> bool {
        self.failures() == 0
    }

    /// The failed and panicked handlers with their outcomes.
    pub fn failed(&self) -> impl Iterator<Item = &HandlerOutcome> {
        self.outcomes.iter().filter(|o| o.outcome.is_failure())
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().filter(|o| f(&o.outcome)).count()
    }

    pub(crate) fn merge(&mut self, other: DispatchReport) {
        self.outcomes.extend(other.outcomes);
    }
}

impl fmt::Display for DispatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:", self.event_name, self.event_id)?;
        for o in &self.outcomes {
            write!(f, " {} {};", o.handler, o.outcome)?;
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    /// One dispatch returns one report by value: keep it small (no allocation, few bytes
    /// copied) — see the `dispatch` benchmark.
    #[test]
    fn reports_stay_small() {
        assert_eq!(std::mem::size_of::<super::Outcome>(), 16);
        assert!(std::mem::size_of::<super::DispatchReport>() <= 176);
    }
}
