//! The records a store returns to its readers: dead letters and their filter, backlog
//! statistics, the audit log, pauses, and the dead-letter reasons. Plain data, no queries.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Why a delivery is in the dead letter queue, stored as a stable string (the `reason`
/// column). A string this version does not know (written by a newer release) reads as
/// [`Other`](Self::Other), never as an error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// `unknown_event`: no registered type has the event's name, or not its version (a newer
    /// producer, or a newer instance during a rolling deploy). Replay after deploying code
    /// that knows it.
    UnknownEvent,
    /// `undecodable`: the envelope or its payload does not decode into the registered type
    /// (a missing required field, a wrong type), or cannot be upcast.
    Undecodable,
    /// `unknown_handler`: no handler or destination of that name is registered.
    UnknownHandler,
    /// `permanent`: the handler said retrying cannot help.
    Permanent,
    /// `exhausted`: the last allowed attempt failed too.
    Exhausted,
    /// `unrecordable`: the outcome of the delivery could not be recorded (the database
    /// refused the statement); the error chain says why.
    Unrecordable,
    /// `conflict`: a message a transport's inbox received names an (aggregate, sequence) that
    /// the outbox already holds under another event id (a producer that re-published its
    /// events with new ids, from a fresh database). Purge it when the stored event is the one
    /// to keep; a replay commits it once that place is free.
    Conflict,
    /// `late`: a message a transport's inbox received for a place in its aggregate's chain
    /// whose gap an operator accepted (`events inbox gaps accept`): the events after it were
    /// handled without it. A replay delivers it, out of order.
    Late,
    /// `invalid`: a received envelope whose payload does not match the JSON Schema of its
    /// (name, version), with schema validation on
    /// ([`DispatcherBuilder::validate_schemas`](crate::DispatcherBuilder::validate_schemas));
    /// the error names the JSON pointer of the first violation. Replay after a deploy whose
    /// schema accepts it, or purge it and have the producer send it again.
    Invalid,
    /// A reason this version does not know.
    Other(String),
}

impl DeadLetterReason {
    /// The stored string.
    pub fn as_str(&self) -> &str {
        match self {
            DeadLetterReason::UnknownEvent => "unknown_event",
            DeadLetterReason::Undecodable => "undecodable",
            DeadLetterReason::UnknownHandler => "unknown_handler",
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::Unrecordable => "unrecordable",
            DeadLetterReason::Conflict => "conflict",
            DeadLetterReason::Late => "late",
            DeadLetterReason::Invalid => "invalid",
            DeadLetterReason::Other(s) => s,
        }
    }
}

impl FromStr for DeadLetterReason {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "unknown_event" => DeadLetterReason::UnknownEvent,
            "undecodable" => DeadLetterReason::Undecodable,
            "unknown_handler" => DeadLetterReason::UnknownHandler,
            "permanent" => DeadLetterReason::Permanent,
            "exhausted" => DeadLetterReason::Exhausted,
            "unrecordable" => DeadLetterReason::Unrecordable,
            "conflict" => DeadLetterReason::Conflict,
            "late" => DeadLetterReason::Late,
            "invalid" => DeadLetterReason::Invalid,
            other => DeadLetterReason::Other(other.to_owned()),
        })
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for DeadLetterReason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for DeadLetterReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for DeadLetterReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A destination no worker claims deliveries of, until it is resumed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PausedDestination {
    /// The destination (handler) name.
    pub destination: String,
    /// Who paused it: `operator`, or the runtime component (`nats-relay`).
    pub paused_by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub paused_at: DateTime<Utc>,
    /// When a runtime pause lapses unless renewed; `None` for an operator's.
    pub expires_at: Option<DateTime<Utc>>,
    /// A circuit breaker's pause (`paused_by` `breaker`): when one delivery may probe whether
    /// the destination is back (the cool-down's end, or a probe's time limit); `None` for
    /// other pauses.
    pub probe_at: Option<DateTime<Utc>>,
}

/// Outbox backlog, as `events outbox stats` prints it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OutboxStats {
    /// Rows in the outbox (events not purged by retention).
    pub events: u64,
    /// Deliveries not completed yet (due, leased or waiting for a retry).
    pub pending: u64,
    /// Pending deliveries that wait behind a dead letter of the same (handler, aggregate):
    /// they flow once it is replayed or purged.
    pub blocked: u64,
    /// Age of the oldest pending delivery, in seconds.
    pub oldest_pending_age_secs: Option<f64>,
    /// Dead letters not replayed or purged.
    pub dead_letters: u64,
    /// Deliveries whose status this version does not know (written by a newer release, or
    /// edited by hand): counted here, never as another status.
    pub unknown_status: u64,
    /// Pending deliveries whose row the engine cannot read: a column holding what the engine
    /// never writes (edited by hand, or by a foreign tool) — on SQLite a value of the wrong
    /// type (a text `next_attempt_at`), on every store an event id that is not a lower-case
    /// hyphenated UUID, a negative sequence, or an event id with no outbox row. Counted in
    /// [`pending`](Self::pending) too. What the engine does with such a row depends on the
    /// column: a text `next_attempt_at` is never due (it stays pending for good), a row
    /// without its event cannot be decoded, while SQLite coerces some values (a text
    /// `attempts` counts as 0, and the delivery may run). Repair or purge it: `events check`
    /// fails while there are any.
    pub unreadable: u64,
    /// Per-handler delivery counts.
    pub handlers: Vec<HandlerStats>,
}

/// What the workers' gauges show, read every
/// [`OutboxConfig::metrics_interval`](crate::OutboxConfig::metrics_interval) by
/// [`Backend::backlog`](super::Backend::backlog): pending deliveries per destination, open dead
/// letters and pauses. Unlike [`OutboxStats`] it never counts completed deliveries, so reading
/// it costs in proportion to the backlog, not to the history retention keeps.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Backlog {
    /// The destinations that have pending deliveries, by name.
    pub destinations: Vec<DestinationBacklog>,
    /// Dead letters not replayed or purged.
    pub dead_letters: u64,
    /// The destinations paused now, by name.
    pub paused: Vec<String>,
    /// Received events held now, waiting for a predecessor in their aggregate's chain (see
    /// the [inbox core](crate::inbox)).
    pub held: u64,
    /// Open gaps: a predecessor that has not arrived after `gap_after`.
    pub open_gaps: u64,
}

impl Backlog {
    /// Pending deliveries over every destination.
    pub fn pending(&self) -> u64 {
        self.destinations.iter().map(|d| d.pending).sum()
    }

    /// The age of the oldest pending delivery of any destination, in seconds; `None` when
    /// nothing is pending.
    pub fn oldest_pending_age_secs(&self) -> Option<f64> {
        self.destinations
            .iter()
            .map(|d| d.oldest_pending_age_secs)
            .reduce(f64::max)
    }
}

/// The pending deliveries of one destination (a handler or a transport's relay).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DestinationBacklog {
    /// The destination's name, as stored with each delivery.
    pub destination: String,
    /// Deliveries not completed yet: due, leased, waiting for a retry, or held back behind a
    /// dead letter of their aggregate.
    pub pending: u64,
    /// How long ago its oldest pending delivery was committed, in seconds (at least 0). For a
    /// relay this is the lag: the age of the oldest event not yet acknowledged by the broker.
    pub oldest_pending_age_secs: f64,
}

/// Delivery counts of one handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HandlerStats {
    /// The handler name.
    pub handler: String,
    /// Pending deliveries.
    pub pending: u64,
    /// Completed deliveries (until retention purges them).
    pub completed: u64,
    /// Deliveries in the dead letter queue.
    pub dead: u64,
    /// Deliveries given up on by a purge.
    pub purged: u64,
    /// Deliveries in a status this version does not know.
    pub unknown: u64,
    /// Pending deliveries whose row the engine cannot read (counted in
    /// [`pending`](Self::pending) too; see [`OutboxStats::unreadable`]).
    pub unreadable: u64,
    /// Whether the destination is paused now.
    pub paused: bool,
}

/// Selects dead letters. The default selects every open (not replayed, not purged) one.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    /// Only this dead letter.
    pub id: Option<i64>,
    /// Only this handler.
    pub handler: Option<String>,
    /// Only this event name.
    pub event_name: Option<String>,
    /// Dead-lettered at or after.
    pub since: Option<DateTime<Utc>>,
    /// Dead-lettered before.
    pub until: Option<DateTime<Utc>>,
    /// Include replayed and purged ones.
    pub include_resolved: bool,
    /// At most this many.
    pub limit: Option<u32>,
}

/// A delivery that failed for good.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadLetter {
    /// Id in the dead letter queue.
    pub id: i64,
    /// The event id (kept on replay).
    pub event_id: Uuid,
    /// The handler that failed.
    pub handler: String,
    /// The event name.
    pub event_name: String,
    /// The event version.
    pub event_version: u32,
    /// The original envelope, byte for byte; for a message a transport's inbox could not
    /// accept, its body as text (bytes that are not UTF-8, and U+0000, replaced by U+FFFD).
    pub envelope: String,
    /// Attempts made.
    pub attempts: u32,
    /// First failure.
    pub first_failed_at: DateTime<Utc>,
    /// Last failure.
    pub last_failed_at: DateTime<Utc>,
    /// Why.
    pub reason: DeadLetterReason,
    /// The error and its sources, outermost first.
    pub error_chain: Vec<String>,
    /// When it entered the queue.
    pub dead_at: DateTime<Utc>,
    /// When it was replayed or purged.
    pub resolved_at: Option<DateTime<Utc>>,
    /// `replayed` or `purged`.
    pub resolution: Option<String>,
    /// Pending deliveries of the same handler and aggregate that come after it, waiting for
    /// it to be replayed or purged (per-aggregate order holds them back; 0 for an unordered
    /// handler, an event without a sequence, or a resolved dead letter).
    pub held_back: u64,
    /// For a message a transport's inbox could not accept (it never had a delivery): where it
    /// came from. `None` for a delivery's dead letter.
    pub origin: Option<crate::inbox::Origin>,
}

/// What to do with dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Deliver again, same event id, attempts reset.
    Replay,
    /// Give up; later events of the aggregate flow.
    Purge,
}

/// A row of the replay audit log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditEntry {
    /// Row id.
    pub id: i64,
    /// `replay` or `purge`; `pause` or `resume` for an operator's pause of a destination
    /// ([`Store::pause_destination_audited`](crate::Store::pause_destination_audited)), whose
    /// `reason` reads `DESTINATION: TEXT` and which names no dead letters.
    pub action: String,
    /// Who.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// When.
    pub at: DateTime<Utc>,
    /// Which dead letters, for an operation on dead letters named by id
    /// ([`Store::resolve_dead_letters`](crate::Store::resolve_dead_letters)); empty for one
    /// over a selection ([`Store::resolve_matching`](crate::Store::resolve_matching)), whose
    /// dead letters name this row instead (`event_dead_letters.audit_id`).
    pub dead_letter_ids: Vec<i64>,
    /// How many dead letters it resolved (so far, while it is not finished).
    pub count: u64,
    /// What an operation over a selection selected (JSON: handler, event name, time range,
    /// limit, and the newest dead letter id it may touch); `None` for one by id.
    pub selection: Option<String>,
    /// When it finished; `None` while it runs, or when it was interrupted (resume it with
    /// [`Store::resume_resolution`](crate::Store::resume_resolution)).
    pub finished_at: Option<DateTime<Utc>>,
}

/// Dead letters of one (handler, event name): how many are open and how many were replayed or
/// purged ([`Store::dead_letter_counts`](crate::Store::dead_letter_counts)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterCount {
    /// The handler.
    pub handler: String,
    /// The event name.
    pub event_name: String,
    /// Not replayed or purged.
    pub open: u64,
    /// Replayed or purged.
    pub resolved: u64,
}

/// What [`Store::purge_destination`](crate::Store::purge_destination) or
/// [`Store::retarget_destination`](crate::Store::retarget_destination) did. When the
/// operation continued an interrupted one, the counts are those of this call; the audit row's
/// `count` is of the whole operation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DestinationReport {
    /// The operation's audit row (action `handler-purge` or `handler-retarget`), finished;
    /// its `count` is every delivery and dead letter it purged or moved.
    pub audit: AuditEntry,
    /// Pending deliveries purged, or moved onto the new destination.
    pub deliveries: u64,
    /// Open dead letters purged, or moved onto the new destination (with their deliveries).
    pub dead_letters: u64,
    /// Re-target: deliveries (pending, or dead with their dead letter) of events the new
    /// destination already had a delivery of, purged instead of moved; 0 for a purge.
    pub duplicates: u64,
}

/// One event type in the database's catalog (`event_catalog`): recorded by a service's outbox
/// ([`Store::record_catalog`](crate::Store::record_catalog)), read by the standalone `events`
/// tool to mask what that service marks sensitive.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct CatalogRecord {
    /// The event name.
    pub name: String,
    /// The event version.
    pub version: u32,
    /// The Rust type of the service that recorded it last.
    pub rust_type: String,
    /// The JSON names of the payload fields marked `#[event(sensitive)]`.
    pub sensitive: Vec<String>,
    /// The payload's JSON Schema, with `"x-sensitive": true` on those fields; `None` for a
    /// type that does not derive `schemars::JsonSchema`.
    pub schema: Option<serde_json::Value>,
    /// When it was recorded; `None` before it is (a record to write).
    pub recorded_at: Option<DateTime<Utc>>,
}

impl CatalogRecord {
    /// A record of `name` v`version`, to write with [`Store::record_catalog`](crate::Store::record_catalog).
    pub fn new(
        name: impl Into<String>,
        version: u32,
        rust_type: impl Into<String>,
        sensitive: Vec<String>,
        schema: Option<serde_json::Value>,
    ) -> Self {
        CatalogRecord {
            name: name.into(),
            version,
            rust_type: rust_type.into(),
            sensitive,
            schema,
            recorded_at: None,
        }
    }
}
