//! The parts of the store boundary besides the core [`Backend`](super::Backend): the chain
//! state every backend keeps ([`ChainStore`], required) and the optional capabilities, each
//! reached through an accessor of [`Backend`](super::Backend) that returns `None` by default:
//!
//! | capability | accessor | who needs it (`events` commands, `Store` methods) |
//! |---|---|---|
//! | [`Inspection`] | `inspection()` | `dlq list/show/audit`, `handler list`, `check`; `Store::dead_letters`, `audit_log`, `pending_envelopes` |
//! | [`DeadLetterOperations`] | `dead_letter_operations()` | `dlq replay/purge`; `Store::resolve_dead_letters`, `resolve_matching` |
//! | [`DestinationOperations`] | `destination_operations()` | `handler pause/resume/purge/retarget`, `relay republish`; the `*_audited` pauses, `purge_destination`, `retarget_destination`, `republish` |
//! | [`OperationLog`] | `operation_log()` | every paged operation above, `inbox gaps accept`, `inbox gaps refetch` |
//! | [`PartitionLeases`] | `partition_leases()` | transport instance groups (`NatsGroup`, `AmqpGroup`), `nats group status` |
//!
//! `outbox stats` and the workers' gauges need only the core. [`Store`](crate::Store)'s
//! methods fail with [`StoreError::Unsupported`] naming a capability the backend lacks, and so
//! does the `events` tool embedded over a backend of the application's own (its
//! `cli::App::store_opener`).
//!
//! Where the later work lands: partition leases of scale-out belong to [`PartitionLeases`];
//! the trace context operations keep with each event travels in the envelope
//! ([`NewEvent`](super::NewEvent)), so it needs no trait; the console's grouped dead letters extend
//! [`Inspection`] (as [`Inspection::dead_letter_counts`] does).

use std::collections::HashMap;

use async_trait::async_trait;
use uuid::Uuid;

use super::{
    AuditStamp, DestinationOperation, DestinationPage, Gap, PendingEnvelope, RelayChainKey,
    RelayChainState, RepublishPage, RepublishSelection, RepublishStart, ResolutionOperation,
    ResolutionSelection, ResolutionStart, ResolvedPage,
};
use crate::inbox::Origin;
use crate::store::types::{AuditEntry, DeadLetter, DeadLetterCount, DeadLetterFilter, Resolution};
use crate::store::{GroupView, InboxIdentity, StoreError};

/// The chain state of the sequence-aware inbox and relay: the identity of each transport
/// inbox, where a received event came from, the predecessor each relay publication names,
/// gaps and held events. Required of every backend (a supertrait of
/// [`Backend`](super::Backend)).
#[async_trait]
pub trait ChainStore: Send + Sync {
    /// The identity recorded for the transport inbox `inbox`.
    async fn inbox_identity(&self, inbox: &str) -> Result<Option<InboxIdentity>, StoreError>;

    /// Records `identity` (stamped `now`) when its inbox has none, or has one without a
    /// consumer on the same stream created at the same time; returns what is recorded after.
    async fn record_inbox_identity(
        &self,
        identity: &InboxIdentity,
        now: i64,
    ) -> Result<InboxIdentity, StoreError>;

    /// Replaces the identity of `identity.inbox` and appends an audit row (action
    /// `inbox-adopt`, stamped with `stamp`), in one transaction.
    async fn adopt_inbox_identity(
        &self,
        identity: &InboxIdentity,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError>;

    /// Where the event `event_id` came from, when a transport's inbox received it (`None`
    /// for this service's own events, events received before origins were stored, and ids
    /// not in the outbox).
    async fn received_origin(&self, event_id: Uuid) -> Result<Option<Origin>, StoreError>;

    /// The relay chain rows of `keys` written at or after `fresh_after` (ms; an older row is
    /// expired and its chain restarts at 0): the last sequence published and the predecessor
    /// it named, per key.
    async fn relay_chain(
        &self,
        keys: &[RelayChainKey],
        fresh_after: i64,
    ) -> Result<HashMap<RelayChainKey, RelayChainState>, StoreError>;

    /// The sequences of `aggregate`'s events whose delivery to the relay `destination`
    /// completed (it published them), below `below`, highest first, at most `limit`: what a
    /// delivery published again after later events names as its predecessor.
    async fn published_sequences(
        &self,
        destination: &str,
        aggregate: (&str, &str),
        below: u64,
        limit: usize,
    ) -> Result<Vec<u64>, StoreError>;

    /// Opens a gap for every held received event recorded at or before `older_than` (ms)
    /// whose predecessor did not arrive or was dead-lettered here, unless one is open for
    /// it; at most `limit`. Returns the gaps opened.
    async fn open_gaps(
        &self,
        older_than: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<Gap>, StoreError>;

    /// Gaps in id order: the open ones, or every one with `all`; ids above `after`, at most
    /// `limit`.
    async fn gaps(&self, all: bool, after: i64, limit: usize) -> Result<Vec<Gap>, StoreError>;

    /// Accepts the open gaps `ids` in one transaction under the audit row `audit_id` (written
    /// by [`OperationLog::start_audit`], its count raised by the gaps accepted): the
    /// missing places are skipped and the held events after them released in chain order.
    /// Returns the gaps accepted (a gap closed meanwhile is left out).
    async fn accept_gaps(
        &self,
        ids: &[i64],
        audit_id: i64,
        now: i64,
    ) -> Result<Vec<Gap>, StoreError>;

    /// Received events held now: waiting for a predecessor in their aggregate's chain.
    async fn held_events(&self) -> Result<u64, StoreError>;

    /// Deletes chain state older than `cutoff` (ms): relay rows of aggregates that published
    /// nothing since, places of received aggregates idle since (never a held or dead one);
    /// at most about `limit` rows per table. Returns the rows deleted.
    async fn purge_chains(&self, cutoff: i64, limit: usize) -> Result<u64, StoreError>;
}

/// Reading what the store holds, for operators: dead letters, the audit log, pending
/// envelopes, what a destination left undelivered.
#[async_trait]
pub trait Inspection: Send + Sync {
    /// Dead letters matching `filter`, oldest first.
    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError>;

    /// How many dead letters match `filter`, ignoring its `limit`. The default lists them and
    /// counts; a backend with a query language overrides it with a count.
    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let mut filter = filter.clone();
        filter.limit = None;
        Ok(self.dead_letters(&filter).await?.len() as u64)
    }

    /// Open and resolved dead letters per (handler, event name), ordered by both. The default
    /// lists every dead letter and counts; a backend with a query language overrides it.
    async fn dead_letter_counts(&self) -> Result<Vec<DeadLetterCount>, StoreError> {
        let filter = DeadLetterFilter {
            include_resolved: true,
            ..DeadLetterFilter::default()
        };
        let mut counts: Vec<DeadLetterCount> = Vec::new();
        for d in self.dead_letters(&filter).await? {
            let i = match counts.binary_search_by(|c| {
                (&*c.handler, &*c.event_name).cmp(&(&*d.handler, &*d.event_name))
            }) {
                Ok(i) => i,
                Err(i) => {
                    counts.insert(
                        i,
                        DeadLetterCount {
                            handler: d.handler.clone(),
                            event_name: d.event_name.clone(),
                            open: 0,
                            resolved: 0,
                        },
                    );
                    i
                }
            };
            if d.resolved_at.is_none() {
                counts[i].open += 1;
            } else {
                counts[i].resolved += 1;
            }
        }
        Ok(counts)
    }

    /// The audit log, newest first.
    async fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError>;

    /// Every pending delivery: its destination, event id and envelope.
    async fn pending_envelopes(&self) -> Result<Vec<PendingEnvelope>, StoreError>;

    /// The names of the events `destination` left undelivered (those of its pending
    /// deliveries and open dead letters), sorted, each once.
    async fn undelivered_event_names(&self, destination: &str) -> Result<Vec<String>, StoreError>;

    /// `None` when `destination` has a delivery row; otherwise how many events named in
    /// `names` were recorded at or after `since` (ms), counted up to `cap`.
    async fn unrouted_events(
        &self,
        destination: &str,
        names: &[&str],
        since: i64,
        cap: u64,
    ) -> Result<Option<u64>, StoreError>;
}

/// Replaying and purging dead letters, audited: by ids in one transaction, or over a
/// selection page by page (resumable after an interruption).
#[async_trait]
pub trait DeadLetterOperations: Send + Sync {
    /// Replays or purges the open dead letters `ids` in one transaction with one audit row,
    /// stamped with `stamp`, calling `progress(n)` after each of them.
    async fn resolve_dead_letters(
        &self,
        ids: &[i64],
        action: Resolution,
        stamp: &AuditStamp<'_>,
        progress: &mut (dyn FnMut(usize) + Send),
    ) -> Result<AuditEntry, StoreError>;

    /// Starts a replay or purge over the open dead letters `filter` selects (its `limit`
    /// caps the count; `include_resolved` is ignored): writes its audit row, unfinished,
    /// with the selection, which includes the newest dead letter id now (later ones are never
    /// touched). Returns the row and the selection.
    async fn start_resolution(
        &self,
        filter: &DeadLetterFilter,
        action: Resolution,
        stamp: &AuditStamp<'_>,
    ) -> Result<ResolutionStart, StoreError>;

    /// Resolves the next page of at most `page` open dead letters of `selection`, oldest
    /// first, in one transaction that also adds them to the audit row's count. Returns how
    /// many it selected (fewer than `page`: nothing is left) and how many it resolved.
    async fn resolve_page(
        &self,
        audit_id: i64,
        action: Resolution,
        selection: &ResolutionSelection,
        page: u32,
        now: i64,
    ) -> Result<ResolvedPage, StoreError>;

    /// The operation over a selection with this audit id, or `None`.
    async fn resolution(&self, audit_id: i64) -> Result<Option<ResolutionOperation>, StoreError>;
}

/// Operators' work on a destination, each audited: pausing and resuming it, purging or
/// re-targeting what a removed handler left, re-publishing what a relay published.
#[async_trait]
pub trait DestinationOperations: Send + Sync {
    /// Starts purging (`op.to` `None`) or re-targeting (`op.to` the new destination) what
    /// `op.from` left: refuses with [`StoreError::DestinationInUse`] when a delivery of
    /// `op.from` is leased under a live lease, and with [`StoreError::SameDestination`] when
    /// `op.to` is `op.from`; continues the unfinished operation with the same `op` if there is
    /// one (its audit row); else writes the operation's audit row, unfinished, with `op` as its
    /// selection. Returns the audit row.
    async fn start_destination_operation(
        &self,
        op: &DestinationOperation,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError>;

    /// One page of the operation, in one transaction that also adds what it did to the audit
    /// row's count (refused, changing nothing, with [`StoreError::DestinationInUse`] as the
    /// start is): at most `page` deliveries of `op.from` (pending or dead, in run order)
    /// with their open dead letters, or, when none is left, at most `page` of its open dead
    /// letters without a delivery. A purge marks the deliveries `purged` and resolves the
    /// dead letters as purged (naming the audit row). A re-target drops (as a purge does)
    /// those of events `op.to` has a delivery of already, moves the others onto `op.to` —
    /// each at its event's sequence (0 when `!op.ordered`), a pending one with its attempts
    /// reset and due at `now`, a dead one still dead, its dead letter moved with it — and
    /// recomputes the ready head of every run of `op.to` it merged into. Returns what the page
    /// did; `selected` 0 when nothing is left.
    async fn destination_page(
        &self,
        audit_id: i64,
        op: &DestinationOperation,
        page: u32,
        now: i64,
    ) -> Result<DestinationPage, StoreError>;

    /// Pauses `destination` for the operator (`paused_by` `operator`, no expiry; a pause of
    /// the operator's already there keeps its start and takes `reason`) and appends an audit
    /// row (action `pause`, reason `DESTINATION: REASON`), in one transaction.
    async fn pause_audited(
        &self,
        destination: &str,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError>;

    /// Lifts the operator's pause of `destination` and its circuit breaker's pause (`paused_by`
    /// `breaker`) and appends an audit row (action `resume`), in one transaction; `None`,
    /// writing nothing, when neither had paused it.
    async fn resume_audited(
        &self,
        destination: &str,
        stamp: &AuditStamp<'_>,
    ) -> Result<Option<AuditEntry>, StoreError>;

    /// Starts re-publishing `selection` (refused with [`StoreError::InvalidSelection`] when
    /// it names neither aggregates nor a time): continues the unfinished re-publish of the
    /// same selection if there is one (its audit row), else writes an audit row (action
    /// `relay-republish`, `selection` as JSON), unfinished. Counts the selected events whose
    /// delivery to the destination is pending or dead.
    async fn start_republish(
        &self,
        selection: &RepublishSelection,
        stamp: &AuditStamp<'_>,
    ) -> Result<RepublishStart, StoreError>;

    /// One page of a re-publish, in one transaction that also adds to the audit row's count:
    /// at most `page` of the selected events, in event id order after `after`, whose delivery
    /// to the destination completed at or before `started` (ms: the audit row's time, so that
    /// what this re-publish made pending and the relay published again is not selected
    /// twice), made pending again — attempts reset, due at `now`, joined to their runs in
    /// sequence order (each run's ready head recomputed).
    async fn republish_page(
        &self,
        audit_id: i64,
        selection: &RepublishSelection,
        started: i64,
        after: &str,
        page: u32,
        now: i64,
    ) -> Result<RepublishPage, StoreError>;
}

/// The audit rows of operations that run page by page: started unfinished, counted as pages
/// are done, finished at the end (an interrupted one is found and resumed by its row).
#[async_trait]
pub trait OperationLog: Send + Sync {
    /// Appends an unfinished audit row (`action`, `selection` as given, stamped with
    /// `stamp`) for an operation that runs page by page; finish it with
    /// [`finish_operation`](Self::finish_operation).
    async fn start_audit(
        &self,
        action: &str,
        selection: Option<&str>,
        stamp: &AuditStamp<'_>,
    ) -> Result<AuditEntry, StoreError>;

    /// Adds `n` to the count of the audit row `audit_id` (an operation in steps, one done).
    async fn add_to_audit_count(&self, audit_id: i64, n: u64) -> Result<(), StoreError>;

    /// Marks the operation finished at `now`; returns its audit row.
    async fn finish_operation(&self, audit_id: i64, now: i64) -> Result<AuditEntry, StoreError>;
}

/// Leases of a transport's partitions among the members of an instance group, so that each
/// partition is consumed by one member at a time.
#[async_trait]
pub trait PartitionLeases: Send + Sync {
    /// Renews `member`'s lease in `group` (joining it) and those of the partitions it holds
    /// that have not expired at `now`, to `expires`; deletes the members whose lease expired
    /// before `forget_before`; returns the group at `now`. One transaction.
    async fn group_beat(
        &self,
        group: &str,
        member: &str,
        now: i64,
        expires: i64,
        forget_before: i64,
    ) -> Result<GroupView, StoreError>;

    /// Gives `partition` of `group` to `member` until `expires` when nobody holds it at `now`
    /// or `member` does; whether it did.
    async fn claim_partition(
        &self,
        group: &str,
        partition: u32,
        member: &str,
        now: i64,
        expires: i64,
    ) -> Result<bool, StoreError>;

    /// Releases the partitions (all with `None`) `member` holds in `group`; with `leave`,
    /// deletes its row too. One transaction; how many were released.
    async fn release_partitions(
        &self,
        group: &str,
        member: &str,
        partitions: Option<&[u32]>,
        leave: bool,
    ) -> Result<u64, StoreError>;

    /// The members and partitions of `group` at `now`.
    async fn group_view(&self, group: &str, now: i64) -> Result<GroupView, StoreError>;
}
