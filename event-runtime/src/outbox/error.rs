//! The errors of the outbox layer: what a commit, a delivery loop or a start-up can fail with.
//! Each says what failed at its level; the cause is its `source()`.

use std::time::Duration;

use uuid::Uuid;

use crate::dispatch::{CommitError, RegistryError};
use crate::store::StoreError;

/// Errors of the outbox runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An in-transaction handler failed: the transaction was rolled back, nothing was written.
    #[error(transparent)]
    Aborted(Box<CommitError>),
    /// An event's payload could not be serialised.
    #[error("event {event_id} ({name}) cannot be serialised")]
    Encode {
        /// The event id.
        event_id: Uuid,
        /// The event name.
        name: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// The configuration is invalid.
    #[error("invalid outbox configuration")]
    Config(#[from] ConfigError),
    /// An envelope is larger than [`OutboxConfig::max_envelope_bytes`]; the commit was rolled
    /// back.
    ///
    /// [`OutboxConfig::max_envelope_bytes`]: crate::OutboxConfig::max_envelope_bytes
    #[error("event {event_id} ({name}) is {bytes} bytes as JSON, over the limit of {limit} bytes (OutboxConfig::max_envelope_bytes): store large data elsewhere and put a reference in the event")]
    TooLarge {
        /// The event id.
        event_id: Uuid,
        /// The event name.
        name: &'static str,
        /// Its size in bytes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// An envelope's aggregate type or id contains U+0000, which PostgreSQL cannot store in
    /// text: refused at commit on every store (so that an application behaves the same on
    /// both), before anything is written. (U+0000 inside the payload is fine: JSON escapes
    /// it.)
    #[error("event {event_id} ({name}): its {field} contains U+0000, which PostgreSQL cannot store in text; refused on every store")]
    Unstorable {
        /// The event id.
        event_id: Uuid,
        /// The event name.
        name: &'static str,
        /// `aggregate type` or `aggregate id`.
        field: &'static str,
    },
    /// [`Outbox::drain`](crate::Outbox::drain) ran out of time with deliveries still able to
    /// progress.
    #[error("drain timed out with {pending} runs of deliveries still able to progress")]
    Timeout {
        /// Runs (the pending deliveries of one destination and aggregate, in order) still able
        /// to progress: not waiting behind a dead letter, not paused.
        pending: u64,
    },
    /// [`Outbox::purge_unregistered`](crate::Outbox::purge_unregistered) or
    /// [`Outbox::retarget_unregistered`](crate::Outbox::retarget_unregistered) of a destination
    /// this outbox has: its workers deliver it, and would race the purge or move. Nothing was
    /// changed.
    #[error("`{destination}` is a destination of this outbox: its workers deliver it; purge or re-target only a destination no process has; nothing was changed")]
    Registered {
        /// The destination.
        destination: String,
    },
    /// [`Outbox::retarget_unregistered`](crate::Outbox::retarget_unregistered) onto a
    /// destination this outbox does not have: nothing would deliver what moved there.
    /// Nothing was changed.
    #[error("`{destination}` is not a destination of this outbox: re-target onto one of its handlers or transports' destinations ({known}); nothing was changed")]
    NotRegistered {
        /// The destination.
        destination: String,
        /// This outbox's destinations, comma-separated.
        known: String,
    },
    /// A re-target onto a destination that does not take every event the old one left:
    /// nothing would deliver those there (they would be dead-lettered). Nothing was changed.
    #[error("`{destination}` does not take {events}, which the old destination left undelivered: re-target onto a handler of those events, or purge; nothing was changed")]
    TakesOtherEvents {
        /// The destination.
        destination: String,
        /// The event names it does not take, comma-separated.
        events: String,
    },
    /// [`Outbox::replay_inbox_dead_letters`](crate::Outbox::replay_inbox_dead_letters): an
    /// inbox dead letter still does not decode (its event type or version is still unknown to
    /// this service's registry, or its payload does not fit it). Nothing was replayed.
    #[error("dead letter {dead_letter} still does not decode; nothing was replayed")]
    NotReplayable {
        /// The dead letter's id.
        dead_letter: i64,
        /// Why.
        #[source]
        source: event_core::DecodeError,
    },
    /// [`Outbox::replay_inbox_dead_letters`](crate::Outbox::replay_inbox_dead_letters) with
    /// schema validation on: an inbox dead letter's payload still does not match its JSON
    /// Schema. Nothing was replayed.
    #[error(
        "dead letter {dead_letter} still does not match its JSON Schema; nothing was replayed"
    )]
    NotValid {
        /// The dead letter's id.
        dead_letter: i64,
        /// The first violation.
        #[source]
        source: crate::schema::SchemaViolation,
    },
    /// Some outcomes of deliveries could not be recorded (the database kept refusing them):
    /// those deliveries run again once the worker's lease lapses (at-least-once).
    #[error("some delivery outcomes could not be recorded; those deliveries run again once the lease lapses")]
    Unrecorded,
    /// A fault was injected at this point (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fault-injection")))]
    #[error("fault injected at {0:?}")]
    Injected(crate::testing::FaultPoint),
}

impl OutboxError {
    /// `error.type` of a span a commit ends with this error (`conflict`, `aborted`, `encode`,
    /// `too_large`, `unstorable`, `store`, …).
    pub(crate) fn error_type(&self) -> &'static str {
        match self {
            OutboxError::Store(StoreError::Conflict { .. }) => "conflict",
            OutboxError::Store(_) => "store",
            OutboxError::Aborted(_) => "aborted",
            OutboxError::Encode { .. } => "encode",
            OutboxError::TooLarge { .. } => "too_large",
            OutboxError::Unstorable { .. } => "unstorable",
            _ => "other",
        }
    }
}

/// Why [`OutboxBuilder::build`](crate::OutboxBuilder::build) refused the configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The registry of events and handlers failed validation.
    #[error("the registry of events and handlers is invalid")]
    Registry(#[from] RegistryError),
    /// A count or duration that must be positive is zero.
    #[error("{field} must be positive")]
    NotPositive {
        /// The `OutboxConfig` field.
        field: &'static str,
    },
    /// The lease is too short for renewal to keep it.
    #[error("lease ({lease:?}) must be at least {min:?}")]
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The shortest accepted.
        min: Duration,
    },
    /// Options name a destination that is not registered.
    #[error(
        "options are given for `{0}`, which is neither a registered handler nor a destination"
    )]
    UnknownDestination(String),
    /// A circuit breaker setting is out of range, or a handler is given a breaker and
    /// `no_circuit_breaker` at once.
    #[error("the circuit breaker of {of}: {field} {rule}")]
    CircuitBreaker {
        /// `the outbox`, or the destination in backquotes.
        of: String,
        /// The [`CircuitBreaker`](crate::CircuitBreaker) field.
        field: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A circuit breaker is given to a relay (an external destination): relays have their own
    /// pause, for a broker they cannot reach.
    #[error("`{0}` is a relay, not a handler: a circuit breaker applies to handlers only (a relay pauses by itself while its broker is unreachable, without using attempts)")]
    BreakerOnRelay(String),
    /// A retry policy allows no attempt.
    #[error("the retry policy of {0} has max_attempts 0: it must be at least 1")]
    ZeroAttempts(String),
    /// A destination's time limit or concurrency is zero.
    #[error("the {field} of `{destination}` must be positive")]
    DestinationNotPositive {
        /// The destination.
        destination: String,
        /// `timeout` or `concurrency`.
        field: &'static str,
    },
    /// Retention would purge the record of a completed delivery while a retry of it is still
    /// possible.
    #[error("retention ({retention:?}) must be longer than the longest retry horizon ({horizon:?}); otherwise the record that a delivery completed could be purged while a retry of it is still possible")]
    RetentionTooShort {
        /// The retention.
        retention: Duration,
        /// The longest retry horizon.
        horizon: Duration,
    },
    /// Two destinations have one name.
    #[error("two destinations are named `{0}`: destination names are stored with every delivery and must be unique")]
    DuplicateDestination(String),
}
