//! The rows that cross the store boundary: what the engine, the unit of work and the tools
//! hand a backend ([`NewEvent`], [`ClaimRequest`], [`Settlement`], [`Pause`], an inbox's
//! dead letter…) and what a backend hands back ([`ClaimedDelivery`], [`SettleResult`], …).
//! Plain data, no queries.

use uuid::Uuid;

use crate::inbox::Origin;
use crate::store::types::{AuditEntry, DeadLetterReason};
use crate::store::StoreError;

/// One event to append to the outbox, with the destinations that receive it.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The event id (CloudEvents `id`), the outbox's primary key.
    pub event_id: Uuid,
    /// The event name (CloudEvents `type`).
    pub name: String,
    /// The schema version.
    pub version: u32,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The aggregate sequence; 0 for an unsequenced event (never ordered, never checked).
    pub sequence: u64,
    /// When the event happened, ms since the epoch.
    pub occurred_at: i64,
    /// The CloudEvents JSON envelope, stored byte for byte.
    pub envelope: String,
    /// The destinations that get a delivery row.
    pub routes: Vec<Route>,
    /// Where an event a transport's inbox received came from: the JSON of an
    /// [`Origin`], stored in the `origin` column; `None` for this
    /// service's own events.
    pub origin: Option<String>,
}

/// A message a transport's inbox cannot accept, for the dead letter queue (kind `inbox`):
/// written with the batch it came in ([`BackendTransaction::insert_inbox_dead_letter`](super::BackendTransaction::insert_inbox_dead_letter)).
#[derive(Debug, Clone)]
pub struct InboxDeadLetter {
    /// The inbox (the dead letter's `handler`), e.g. `nats-inbox:billing`.
    pub inbox: String,
    /// The event id: the envelope's, or one that names the message the same way on every
    /// redelivery.
    pub event_id: Uuid,
    /// The event name, empty when the body did not decode that far.
    pub name: String,
    /// The event version, 0 when the body did not decode that far.
    pub version: u32,
    /// The body as received (lossily UTF-8, U+0000 replaced: every database stores it).
    pub body: String,
    /// Why.
    pub reason: DeadLetterReason,
    /// The error and its sources, outermost first.
    pub error_chain: Vec<String>,
    /// Where it came from; its delivery count is the dead letter's `attempts`.
    pub origin: Origin,
}

/// An inbox dead letter that a replay took out of the queue
/// ([`BackendTransaction::take_inbox_dead_letters`](super::BackendTransaction::take_inbox_dead_letters)): its body, to be committed again.
#[derive(Debug, Clone)]
pub struct TakenDeadLetter {
    /// The dead letter's id.
    pub id: i64,
    /// The body as received.
    pub body: String,
    /// Where it came from (`None` for a row whose origin does not read).
    pub origin: Option<Origin>,
}

/// An event's place in its aggregate's stream, as
/// [`BackendTransaction::held_places`](super::BackendTransaction::held_places) looks it up.
#[derive(Debug, Clone, Copy)]
pub struct PlaceQuery<'a> {
    /// The aggregate type, as stored (a received event's key).
    pub aggregate_type: &'a str,
    /// The aggregate id.
    pub aggregate_id: &'a str,
    /// The sequence, above 0.
    pub sequence: i64,
    /// The event id that would take it.
    pub event_id: Uuid,
}

/// A destination of an event, as written to its delivery row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destination name (the `handler` column).
    pub destination: String,
    /// Whether deliveries to it keep per-aggregate order.
    pub ordered: bool,
}

/// What a claim asks for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The worker's lease token. A claim that leases anything writes (or extends) the lease
    /// row in the same transaction, so a worker that claims nothing writes nothing.
    pub token: &'a str,
    /// The lease's owner (`host:pid`), for operators.
    pub owner: &'a str,
    /// Until when the lease holds unless renewed, ms.
    pub lease_expires_at: i64,
    /// The destinations this worker can deliver to; others are left alone.
    pub destinations: &'a [String],
    /// At most this many runs (ready heads).
    pub max_runs: usize,
    /// At most this many deliveries in all; runs share them.
    pub max_deliveries: usize,
    /// The current time, ms.
    pub now: i64,
}

/// What [`Backend::claim_probe`](super::Backend::claim_probe) asks: take the probe of a
/// circuit breaker's pause and lease one delivery to probe with.
#[derive(Debug, Clone, Copy)]
pub struct ProbeRequest<'a> {
    /// The destination whose breaker's pause is probed.
    pub destination: &'a str,
    /// The worker's lease token (written as the probe's holder and on the delivery).
    pub token: &'a str,
    /// The lease's owner (`host:pid`), for operators.
    pub owner: &'a str,
    /// Until when the worker's lease holds unless renewed, ms.
    pub lease_expires_at: i64,
    /// The pause's next `probe_at` once taken, ms: when another worker may take the probe if
    /// this one never reports (it died). At least the probe delivery's time limit away.
    pub probe_until: i64,
    /// The current time, ms.
    pub now: i64,
}

/// What [`Backend::claim_probe`](super::Backend::claim_probe) came to.
#[derive(Debug, Clone)]
pub enum ProbeClaim {
    /// No probe was taken: no breaker pause, its probe not due yet (or taken by another
    /// worker), or another pause of the destination in force.
    NotDue,
    /// The probe was taken but the destination has no delivery to probe with: the breaker's
    /// pause was lifted.
    Nothing,
    /// The probe was taken and this delivery leased to the worker.
    Claimed(ClaimedDelivery),
}

/// A delivery leased to a worker, with its envelope.
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    /// The destination.
    pub destination: String,
    /// The event id.
    pub event_id: Uuid,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The delivery's sequence (0 when unordered).
    pub sequence: u64,
    /// Attempts recorded so far (a delivery taken over from a dead worker counts one).
    pub attempts: u32,
    /// The first failure, ms.
    pub first_failed_at: Option<i64>,
    /// The event name.
    pub name: String,
    /// The event version.
    pub version: u32,
    /// The stored envelope.
    pub envelope: String,
    /// For a relay's delivery of an ordered event: the predecessor it publishes with
    /// (`prevsequence`), set by the engine from `event_relay_chain` before it is published.
    /// A backend's claim returns `None`.
    pub relay_previous: Option<u64>,
}

/// The outcome of one claimed delivery, to record.
#[derive(Debug, Clone, Copy)]
pub struct Settlement<'a> {
    /// The destination.
    pub destination: &'a str,
    /// The event id.
    pub event_id: Uuid,
    /// The aggregate type (with the id and the sequence: the run, whose next delivery a
    /// completion makes ready).
    pub aggregate_type: &'a str,
    /// The aggregate id.
    pub aggregate_id: &'a str,
    /// The delivery's sequence (0 when unordered).
    pub sequence: u64,
    /// What happened.
    pub outcome: SettleOutcome<'a>,
    /// For a relay's delivery of an ordered event: the predecessor it published with
    /// (`prevsequence`). A completion records (destination, aggregate) → (sequence, this)
    /// in `event_relay_chain`. `None` for local handlers.
    pub relay_previous: Option<u64>,
}

/// What happened to a claimed delivery.
#[derive(Debug, Clone, Copy)]
pub enum SettleOutcome<'a> {
    /// Its handler ran and succeeded: completed. `attempts` includes this one.
    Completed {
        /// Attempts including this one.
        attempts: u32,
    },
    /// It failed and will be retried at `next_attempt_at`.
    Retry {
        /// Attempts including this one.
        attempts: u32,
        /// When it is due again, ms.
        next_attempt_at: i64,
        /// When the attempt failed, ms: stored as `last_failed_at` (and `first_failed_at` on
        /// the first failure), never later than `next_attempt_at`.
        failed_at: i64,
        /// The error, already made storable.
        error: &'a str,
    },
    /// It goes to the dead letter queue with its envelope, copied from the outbox.
    Dead {
        /// Attempts including this one (0 when it was never attempted).
        attempts: u32,
        /// The reason, as stored.
        reason: &'a str,
        /// When the last attempt failed (or the delivery was found undeliverable), ms.
        failed_at: i64,
        /// The error chain, outermost first, already made storable.
        chain: &'a [String],
    },
    /// It was not attempted (the rest of a run after a failure, a shutdown, a pause): leased
    /// no more, due as before, no attempt counted.
    Release,
}

/// The result of recording one settlement.
#[derive(Debug)]
pub enum SettleResult {
    /// Recorded.
    Settled,
    /// The delivery is leased to another token (taken over): nothing was changed.
    LeaseLost,
    /// Recording failed; nothing of it was changed.
    Failed(StoreError),
}

/// A pause of a destination: no worker claims its deliveries until it is lifted (deliveries
/// already claimed finish). Pauses by different `paused_by` are independent: a runtime
/// component lifting its own pause does not lift an operator's.
#[derive(Debug, Clone)]
pub struct Pause {
    /// The destination.
    pub destination: String,
    /// Who: `operator`, or the runtime component (`nats-relay`).
    pub paused_by: String,
    /// Why, shown by `events handler list`.
    pub reason: String,
    /// When, ms.
    pub at: i64,
    /// When it lapses by itself unless renewed, ms (a runtime pause, so that the pause of a
    /// process that died does not last for ever); `None`: until resumed.
    pub expires_at: Option<i64>,
    /// A circuit breaker's pause (`paused_by` `breaker`): when one worker may take its probe,
    /// ms ([`Backend::claim_probe`](super::Backend::claim_probe)); `None` for other pauses.
    /// Writing a pause again clears a probe taken of it.
    pub probe_at: Option<i64>,
}

/// What one step of the retention purge deleted ([`Backend::purge_completed`](super::Backend::purge_completed)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeStep {
    /// Completed deliveries deleted.
    pub deliveries: u64,
    /// Outbox rows deleted.
    pub events: u64,
    /// Another purger holds the purge lock: nothing was deleted.
    pub busy: bool,
}

/// What a replay or purge over a selection selects, stored as JSON in its audit row so that an
/// interrupted operation resumes on the same dead letters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolutionSelection {
    /// Only this dead letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// Only this handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Only this event name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_name: Option<String>,
    /// Dead-lettered at or after (milliseconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Dead-lettered before (milliseconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// At most this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The newest dead letter when the operation started: later ones are not selected.
    pub up_to_id: i64,
}

/// A purge or re-target of what a destination left in the store
/// ([`DestinationOperations::start_destination_operation`](super::DestinationOperations::start_destination_operation)), stored as JSON in its audit row so that an
/// interrupted one is continued by the same request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DestinationOperation {
    /// The destination whose deliveries and dead letters are purged or moved.
    pub from: String,
    /// Where they move; `None`: purge them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Whether `to` keeps per-aggregate order (moved deliveries take their event's sequence);
    /// `false` for a purge.
    #[serde(default)]
    pub ordered: bool,
}

impl DestinationOperation {
    /// The audit log's action: `handler-purge` or `handler-retarget`.
    pub fn action(&self) -> &'static str {
        if self.to.is_some() {
            "handler-retarget"
        } else {
            "handler-purge"
        }
    }
}

/// What one page of a [`DestinationOperation`] did ([`DestinationOperations::destination_page`](super::DestinationOperations::destination_page)), or the
/// sum of the pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DestinationPage {
    /// Rows the page selected; 0 when nothing was left.
    pub selected: u64,
    /// Pending deliveries purged or moved.
    pub deliveries: u64,
    /// Open dead letters purged or moved (with their dead deliveries).
    pub dead_letters: u64,
    /// Re-target: deliveries (pending or dead, with their dead letters) of events the new
    /// destination already had a delivery of, purged instead of moved.
    pub duplicates: u64,
}

/// A re-publish of events a relay published already ([`DestinationOperations::start_republish`](super::DestinationOperations::start_republish)):
/// stored as JSON in its audit row, so that an interrupted one is continued by the same
/// request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RepublishSelection {
    /// The relay destination (`nats:EVENTS`).
    pub destination: String,
    /// Only these aggregates, as (aggregate type, aggregate id); every aggregate when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregates: Vec<(String, String)>,
    /// Only events recorded in this outbox at or after this time (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
}

impl RepublishSelection {
    /// Events of `destination`: narrow it with [`aggregate`](Self::aggregate) or
    /// [`since_ms`](Self::since_ms) (the store refuses a selection with neither).
    pub fn new(destination: impl Into<String>) -> Self {
        RepublishSelection {
            destination: destination.into(),
            aggregates: Vec::new(),
            since_ms: None,
        }
    }

    /// Adds the aggregate (`aggregate_type`, `aggregate_id`) to the selection.
    #[must_use]
    pub fn aggregate(
        mut self,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
    ) -> Self {
        self.aggregates
            .push((aggregate_type.into(), aggregate_id.into()));
        self
    }

    /// Only events recorded at or after `ms` (ms since the Unix epoch).
    #[must_use]
    pub fn since_ms(mut self, ms: i64) -> Self {
        self.since_ms = Some(ms);
        self
    }
}

/// How a re-publish starts ([`DestinationOperations::start_republish`](super::DestinationOperations::start_republish)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RepublishStart {
    /// Its audit row (action `relay-republish`), unfinished; the one of an unfinished
    /// re-publish of the same selection, continued.
    pub audit: AuditEntry,
    /// Selected events whose delivery to the destination is pending: published anyway.
    pub pending: u64,
    /// Selected events whose delivery is dead-lettered: replay their dead letters instead.
    pub dead: u64,
}

/// What one page of a re-publish did ([`DestinationOperations::republish_page`](super::DestinationOperations::republish_page)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepublishPage {
    /// Deliveries made pending again.
    pub republished: u64,
    /// The last event id the page looked at (the next page starts after it); `None` when
    /// nothing was left.
    pub last: Option<String>,
}

/// A relay chain key: (relay destination, aggregate type, aggregate id).
pub type RelayChainKey = (String, String, String);

/// What fills a place of a received aggregate's chain ([`BackendTransaction::link`](super::BackendTransaction::link)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkKind {
    /// An accepted event: released when its predecessor is, held until then.
    Event,
    /// A dead letter of an event this consumer does not take (an unknown name): fills its
    /// place, never holds its successors.
    Filler,
    /// A dead letter of an event this consumer should have taken (an unknown version,
    /// undecodable, a conflict, refused for good): holds its successors until it is
    /// replayed, or purged (which accepts the gap).
    DeadLetter,
}

/// One place of a received aggregate's chain.
#[derive(Debug, Clone)]
pub struct ChainLink {
    /// The aggregate type as stored (a received key: `<type>@<source>`).
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event's sequence (a link of sequence 0 is ignored).
    pub sequence: u64,
    /// The predecessor the producer's relay named (`prevsequence`); 0 for none.
    pub previous: u64,
    /// The event id.
    pub event_id: Uuid,
    /// What fills the place.
    pub kind: LinkKind,
}

/// What [`BackendTransaction::link`](super::BackendTransaction::link) did.
#[derive(Debug, Clone, Default)]
pub struct Linked {
    /// Events linked that stay held (their predecessor is not released).
    pub held: Vec<Uuid>,
    /// Events released by this link, held before or linked now, in chain order per
    /// aggregate.
    pub released: Vec<Uuid>,
    /// Open gaps that closed because their missing event arrived.
    pub closed_gaps: u64,
}

/// A gap in a received aggregate's chain: a held event whose predecessor did not arrive in
/// time (`event_inbox_gaps`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Gap {
    /// The gap's id.
    pub id: i64,
    /// The aggregate type as stored (`<type>@<source>` for a received event).
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The missing predecessor's sequence (earlier ones may be missing too).
    pub missing_sequence: u64,
    /// The held event that names it.
    pub waiting_sequence: u64,
    /// Its event id.
    pub waiting_event_id: Uuid,
    /// When it was received, ms since the epoch.
    pub waiting_since: i64,
    /// The open inbox dead letter at the missing place, when the event arrived and was
    /// dead-lettered here.
    pub dead_letter_id: Option<i64>,
    /// When the gap was reported, ms.
    pub opened_at: i64,
    /// When it closed, ms.
    pub closed_at: Option<i64>,
    /// How it closed: `arrived` (the missing event came) or `accepted` (an operator).
    pub resolution: Option<String>,
}

/// Who did an audited operation, why, and when: the stamp of its audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditStamp<'a> {
    /// Who asked (the operator's name, `events` user, or the service).
    pub actor: &'a str,
    /// Why, in the operator's words.
    pub reason: &'a str,
    /// When, in milliseconds since the Unix epoch (UTC).
    pub at: i64,
}

/// One pending delivery's event, as [`Inspection::pending_envelopes`](super::Inspection::pending_envelopes)
/// lists it (what `events catalog check` decodes against the registered types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEnvelope {
    /// The delivery's destination (handler or relay).
    pub destination: String,
    /// The event id (a UUID, as text).
    pub event_id: String,
    /// The stored envelope: CloudEvents JSON.
    pub envelope: String,
}

/// A relay chain row ([`ChainStore::relay_chain`](super::ChainStore::relay_chain)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayChainState {
    /// The last sequence of the aggregate the relay published.
    pub last: u64,
    /// The predecessor that publication named (`prevsequence`).
    pub previous: u64,
}

/// A replay or purge over a selection, started
/// ([`DeadLetterOperations::start_resolution`](super::DeadLetterOperations::start_resolution)).
#[derive(Debug, Clone)]
pub struct ResolutionStart {
    /// Its audit row, unfinished.
    pub entry: AuditEntry,
    /// What it selects, as stored in the row.
    pub selection: ResolutionSelection,
}

/// A replay or purge over a selection, read back by its audit id
/// ([`DeadLetterOperations::resolution`](super::DeadLetterOperations::resolution)).
#[derive(Debug, Clone)]
pub struct ResolutionOperation {
    /// Its audit row.
    pub entry: AuditEntry,
    /// Replay or purge.
    pub action: crate::store::types::Resolution,
    /// What it selects.
    pub selection: ResolutionSelection,
}

/// What one page of a replay or purge did
/// ([`DeadLetterOperations::resolve_page`](super::DeadLetterOperations::resolve_page)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolvedPage {
    /// Dead letters the page selected: fewer than the page size when nothing is left.
    pub selected: u64,
    /// Of those, how many it resolved (one resolved meanwhile by another operator is not).
    pub resolved: u64,
}

/// Inbox dead letters taken for a replay
/// ([`BackendTransaction::take_inbox_dead_letters`](super::BackendTransaction::take_inbox_dead_letters)).
#[derive(Debug, Clone, Default)]
pub struct TakenDeadLetters {
    /// The audit row written, `None` when no id was an open inbox dead letter.
    pub audit: Option<AuditEntry>,
    /// Their bodies, in the order of the ids asked for.
    pub letters: Vec<TakenDeadLetter>,
}

impl<'a> AuditStamp<'a> {
    /// `actor` and `reason`, at the time now (the callers' clock: a backend never reads one).
    pub(crate) fn now(actor: &'a str, reason: &'a str) -> Self {
        AuditStamp {
            actor,
            reason,
            at: crate::store::now_ms(),
        }
    }
}
