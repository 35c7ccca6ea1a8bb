//! The event recorder an aggregate holds: domain methods record events, the application takes
//! them and hands them to a unit of work. Pure bookkeeping, no I/O.

use crate::envelope::{AnyEnvelope, Envelope};
use crate::event::DomainEvent;

/// Collects the events an aggregate records while it handles a command, numbering them with
/// the aggregate's per-aggregate sequence.
///
/// ```
/// use event_core::{DomainEvent, EventRecorder};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "account.opened", version = 1)]
/// struct AccountOpened { #[event(aggregate_id)] account: String }
///
/// struct Account { id: String, events: EventRecorder }
/// impl Account {
///     fn open(id: &str) -> Self {
///         let mut a = Account { id: id.into(), events: EventRecorder::new() };
///         a.events.record(AccountOpened { account: a.id.clone() });
///         a
///     }
/// }
///
/// let mut account = Account::open("acc-1");
/// let pending = account.events.take();
/// assert_eq!(pending.len(), 1);
/// assert_eq!(pending[0].metadata().sequence, 1);
/// assert_eq!(account.events.version(), 1);
/// ```
#[derive(Debug, Default)]
pub struct EventRecorder {
    version: u64,
    pending: Vec<Box<dyn AnyEnvelope>>,
}

impl EventRecorder {
    /// A recorder for a new aggregate (version 0): the first event gets sequence 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder for an aggregate loaded at `version` (the sequence of its last event).
    pub fn at_version(version: u64) -> Self {
        EventRecorder {
            version,
            pending: Vec::new(),
        }
    }

    /// Records `event` with the next sequence number and returns its envelope, to add a
    /// correlation id or headers.
    pub fn record<E: DomainEvent>(&mut self, event: E) -> &mut Envelope<E> {
        self.version += 1;
        let envelope = Envelope::new(event).with_sequence(self.version);
        self.pending.push(Box::new(envelope));
        let last = self.pending.last_mut().expect("just pushed");
        let any: &mut dyn std::any::Any = &mut **last;
        any.downcast_mut::<Envelope<E>>()
            .expect("the envelope just pushed is an Envelope<E>")
    }

    /// The sequence of the last recorded event (the aggregate's version).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The events recorded and not yet taken.
    pub fn pending(&self) -> &[Box<dyn AnyEnvelope>] {
        &self.pending
    }

    /// `true` when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the pending events, in recording order.
    pub fn take(&mut self) -> Vec<Box<dyn AnyEnvelope>> {
        std::mem::take(&mut self.pending)
    }

    /// Drops the pending events and rewinds the version to before them (the command failed).
    pub fn discard(&mut self) {
        self.version -= self.pending.len() as u64;
        self.pending.clear();
    }
}
