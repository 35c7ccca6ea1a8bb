//! The store-backed unit of work: the events of one command committed in one transaction
//! with the application's writes, their in-transaction handlers, and their delivery rows.
//! Delivers nothing: workers do, after COMMIT.

use std::collections::HashSet;

use event_core::{AnyEnvelope, DeliveryMode, DomainEvent, Envelope};

use super::destination::Target;
use super::{Outbox, OutboxError};
use crate::dispatch::dispatcher::Phase;
use crate::dispatch::{CommitError, DispatchReport, Dispatcher};
use crate::store::backend::NewEvent;
use crate::store::Tx;

/// What a unit of work's commit did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CommitReport {
    /// Events written to the outbox.
    pub appended: usize,
    /// Events skipped because their id was already in the outbox.
    pub duplicates: usize,
    /// The in-transaction handlers' outcomes, one report per appended event.
    pub in_transaction: Vec<DispatchReport>,
    /// The ids of the events appended.
    pub(crate) appended_ids: std::collections::HashSet<uuid::Uuid>,
}

/// The events of one command and the store transaction that carries them and the
/// application's own writes.
///
/// [`commit`](Self::commit): 1. appends one outbox row per event (an id already present, or
/// added twice to this unit of work, is skipped whole); 2. runs the `in_transaction` handlers of the new events inside the
/// transaction — an error rolls everything back; 3. writes one delivery row per (event,
/// destination); 4. COMMITs. No after-commit handler runs, and nothing leaves the process,
/// before COMMIT. Dropping the unit of work without committing rolls back.
#[derive(Debug)]
pub struct OutboxUnitOfWork<'o> {
    outbox: &'o Outbox,
    tx: Option<Tx>,
    pending: Vec<Box<dyn AnyEnvelope>>,
    /// Aligned with `pending`: how a received event is stored (a transport's inbox).
    received: Vec<Option<Received>>,
}

/// An event received from another service: stored with the JSON as received, under an
/// aggregate key that names its producer, and delivered to local handlers only.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) json: String,
    pub(crate) aggregate_type: String,
    /// The origin's JSON.
    pub(crate) origin: Option<String>,
}

impl<'o> OutboxUnitOfWork<'o> {
    pub(crate) fn new(outbox: &'o Outbox, tx: Tx) -> Self {
        OutboxUnitOfWork {
            outbox,
            tx: Some(tx),
            pending: Vec::new(),
            received: Vec::new(),
        }
    }

    /// The open transaction, for the application's own writes.
    pub fn tx(&mut self) -> &mut Tx {
        self.tx
            .as_mut()
            .expect("the transaction is taken only by commit, which consumes the unit of work")
    }

    /// Adds one envelope.
    pub fn add<E: DomainEvent>(&mut self, envelope: Envelope<E>) {
        self.pending.push(Box::new(envelope));
        self.received.push(None);
    }

    /// Adds envelopes taken from a recorder.
    pub fn extend(&mut self, envelopes: impl IntoIterator<Item = Box<dyn AnyEnvelope>>) {
        for envelope in envelopes {
            self.pending.push(envelope);
            self.received.push(None);
        }
    }

    /// Adds an event received from another service (decoded from `json`, which is stored
    /// as it is): its aggregate is keyed by `aggregate_type` (which names the producer, so
    /// that it never collides with this service's own aggregates), and it gets deliveries to
    /// local handlers only, never to a transport's relay. `origin` is stored with it.
    pub(crate) fn add_received(
        &mut self,
        envelope: Box<dyn AnyEnvelope>,
        json: String,
        aggregate_type: String,
        origin: Option<&crate::inbox::Origin>,
    ) {
        self.pending.push(envelope);
        self.received.push(Some(Received {
            json,
            aggregate_type,
            origin: origin.and_then(|o| serde_json::to_string(o).ok()),
        }));
    }

    /// The envelopes added so far.
    pub fn pending(&self) -> &[Box<dyn AnyEnvelope>] {
        &self.pending
    }

    /// Rolls back.
    ///
    /// # Errors
    /// [`OutboxError::Store`] when the connection was lost (the database rolls back anyway).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, the transaction is rolled back all the same.
    pub async fn rollback(mut self) -> Result<(), OutboxError> {
        if let Some(tx) = self.tx.take() {
            tx.rollback().await?;
        }
        Ok(())
    }

    /// Commits: appends the events to the outbox, runs the in-transaction handlers of the
    /// events that were new, writes their delivery rows, and COMMITs — all in the one
    /// transaction. An event whose id is already in the outbox (a retried command, a
    /// redelivered message) is skipped whole: no in-transaction handler, no delivery, no second
    /// effect.
    ///
    /// # Errors
    /// [`OutboxError::Aborted`] when an in-transaction handler failed or panicked (rolled
    /// back); [`OutboxError::Encode`] when a payload cannot be serialised, or
    /// [`OutboxError::TooLarge`] when an envelope exceeds the size limit (rolled back);
    /// [`OutboxError::Store`] — [`StoreError::Conflict`](crate::StoreError::Conflict) naming
    /// the event whose (aggregate, sequence) another commit already recorded,
    /// [`StoreError::SequenceOutOfRange`](crate::StoreError::SequenceOutOfRange) for a
    /// sequence above `i64::MAX`, or a database failure (rolled back).
    ///
    /// # Cancel safety
    /// Not cancel safe once COMMIT is sent: dropped then, the transaction may or may not have
    /// committed (reload to know). Dropped before, everything is rolled back.
    pub async fn commit(mut self) -> Result<CommitReport, OutboxError> {
        let mut creates = Vec::new();
        let result = self.commit_traced(&mut creates).await;
        if !creates.is_empty() {
            let outcome = match &result {
                Ok(report) => Ok(&report.appended_ids),
                Err(e) => Err(e.error_type()),
            };
            crate::telemetry::created(creates, outcome);
        }
        result
    }

    /// [`commit`](Self::commit), collecting the create spans of the events it stamps.
    async fn commit_traced(
        &mut self,
        creates: &mut Vec<(uuid::Uuid, tracing::Span)>,
    ) -> Result<CommitReport, OutboxError> {
        let outbox = self.outbox;
        let inner = &*outbox.inner;
        let mut tx = self.tx.take().expect("commit takes the transaction once");
        let rows = self.event_rows(creates)?;
        let (rows, first) = first_of_each_id(rows);
        let now = inner.clock.now_ms();
        let new_ids = tx.backend().append_events(&rows, now).await?;
        let (new, duplicates) = new_events(&self.pending, &rows, &first, &new_ids);
        let in_transaction = match dispatch_in_transaction(&inner.dispatcher, &mut tx, &new).await {
            Ok(reports) => reports,
            Err(e) => {
                tx.rollback().await?;
                return Err(OutboxError::Aborted(Box::new(e)));
            }
        };
        let new_rows: Vec<&NewEvent> = new.into_iter().map(|(_, row)| row).collect();
        let report = CommitReport {
            appended: new_rows.len(),
            duplicates,
            in_transaction,
            appended_ids: new_ids,
        };
        tx.backend().insert_deliveries(&new_rows, now).await?;
        let tx = fault!(outbox, BeforeCommit, tx);
        tx.commit().await?;
        fault!(outbox, AfterCommit);
        inner.wake.notify_waiters();
        Ok(report)
    }

    /// The outbox row of each pending event, in order: a received event as it was received,
    /// an event of this service's own stamped and encoded.
    fn event_rows(
        &mut self,
        creates: &mut Vec<(uuid::Uuid, tracing::Span)>,
    ) -> Result<Vec<NewEvent>, OutboxError> {
        let inner = &*self.outbox.inner;
        let mut rows = Vec::with_capacity(self.pending.len());
        for (envelope, received) in self.pending.iter_mut().zip(&self.received) {
            rows.push(match received {
                Some(r) => received_row(&**envelope, r, inner)?,
                None => own_row(envelope, inner, creates)?,
            });
        }
        Ok(rows)
    }
}

/// Pairs each pending event the append found new with its row, in the order the events were
/// added, and counts the others (added twice to this unit of work, or already in the outbox)
/// as duplicates.
fn new_events<'p>(
    pending: &'p [Box<dyn AnyEnvelope>],
    rows: &'p [NewEvent],
    first: &[bool],
    new_ids: &HashSet<uuid::Uuid>,
) -> (Vec<(&'p dyn AnyEnvelope, &'p NewEvent)>, usize) {
    let mut new = Vec::with_capacity(new_ids.len());
    let mut duplicates = 0;
    let mut unique = rows.iter().peekable();
    for (envelope, &first) in pending.iter().zip(first) {
        let row = match unique.next_if(|_| first) {
            Some(row) => row,
            None => {
                duplicates += 1;
                continue;
            }
        };
        if !new_ids.contains(&row.event_id) {
            duplicates += 1;
            continue;
        }
        new.push((&**envelope, row));
    }
    (new, duplicates)
}

/// Runs the in-transaction handlers of each new event inside `tx`, event after event; the
/// first failure stops it (the caller rolls back).
async fn dispatch_in_transaction(
    dispatcher: &Dispatcher,
    tx: &mut Tx,
    new: &[(&dyn AnyEnvelope, &NewEvent)],
) -> Result<Vec<DispatchReport>, CommitError> {
    let mut reports = Vec::new();
    for &(envelope, _) in new {
        let dispatched = dispatcher
            .dispatch_phase(
                envelope,
                Phase::Only(DeliveryMode::InTransaction),
                Some(&mut *tx),
            )
            .await;
        reports.push(CommitError::check(dispatched, envelope)?);
    }
    Ok(reports)
}

/// The outbox row of an event received from another service: its JSON as received, under
/// its key's aggregate type, routed to local handlers only (never back out through a relay).
fn received_row(
    envelope: &dyn AnyEnvelope,
    r: &Received,
    inner: &super::Inner,
) -> Result<NewEvent, OutboxError> {
    let meta = envelope.metadata();
    // The same limits as an event of this service's own (a received one keeps
    // the producer's text, in its key's aggregate type).
    storable(envelope, &r.aggregate_type, r.json.len(), inner)?;
    let routes = inner
        .routes
        .get(&envelope.event_type_id())
        .into_iter()
        .flatten()
        .filter(|r| {
            inner
                .destinations
                .get(&r.destination)
                .is_some_and(|d| !matches!(d.target, Target::External(_)))
        })
        .cloned()
        .collect();
    Ok(NewEvent {
        event_id: meta.id,
        name: envelope.name().to_owned(),
        version: envelope.version(),
        aggregate_type: r.aggregate_type.clone(),
        aggregate_id: meta.aggregate_id.clone(),
        sequence: meta.sequence,
        occurred_at: meta.occurred_at.timestamp_millis(),
        envelope: r.json.clone(),
        routes,
        origin: r.origin.clone(),
    })
}

/// The outbox row of an event of this service's own: stamped with the configured source (when
/// it still has the default) and its trace context (its create span goes to `creates`), then
/// encoded and checked.
fn own_row(
    envelope: &mut Box<dyn AnyEnvelope>,
    inner: &super::Inner,
    creates: &mut Vec<(uuid::Uuid, tracing::Span)>,
) -> Result<NewEvent, OutboxError> {
    if let Some(source) = &inner.config.source {
        if envelope.metadata().source == event_core::DEFAULT_SOURCE {
            envelope.metadata_mut().source = source.clone();
        }
    }
    if let Some(span) = crate::telemetry::stamp(&mut **envelope) {
        creates.push((envelope.metadata().id, span));
    }
    let meta = envelope.metadata();
    let json = envelope.to_json().map_err(|source| OutboxError::Encode {
        event_id: meta.id,
        name: envelope.name(),
        source,
    })?;
    storable(&**envelope, &meta.aggregate_type, json.len(), inner)?;
    Ok(NewEvent {
        event_id: meta.id,
        name: envelope.name().to_owned(),
        version: envelope.version(),
        aggregate_type: meta.aggregate_type.clone(),
        aggregate_id: meta.aggregate_id.clone(),
        sequence: meta.sequence,
        occurred_at: meta.occurred_at.timestamp_millis(),
        envelope: json,
        routes: inner
            .routes
            .get(&envelope.event_type_id())
            .cloned()
            .unwrap_or_default(),
        origin: None,
    })
}

/// Keeps the first row of each event id. An event id added twice to this unit of work is one
/// event: the first is appended, the others are duplicates, as an id already in the outbox is
/// (no second in-transaction run, no second delivery, no conflict with itself). Returns the
/// rows kept and, for each row given, whether it was kept.
fn first_of_each_id(rows: Vec<NewEvent>) -> (Vec<NewEvent>, Vec<bool>) {
    let mut seen = HashSet::with_capacity(rows.len());
    let first: Vec<bool> = rows.iter().map(|r| seen.insert(r.event_id)).collect();
    let rows = rows
        .into_iter()
        .zip(&first)
        .filter_map(|(r, &first)| first.then_some(r))
        .collect();
    (rows, first)
}

impl Outbox {
    /// What the commit of a received event stored under `aggregate_type` with an envelope of
    /// `bytes` would refuse whatever else is in its transaction (U+0000 in its aggregate type
    /// or id, an envelope over the limit, a sequence above `i64::MAX`), found before
    /// committing: the inbox core sets such a message aside instead of committing its batch
    /// one message at a time.
    pub(crate) fn unstorable(
        &self,
        envelope: &dyn AnyEnvelope,
        aggregate_type: &str,
        bytes: usize,
    ) -> Result<(), OutboxError> {
        storable(envelope, aggregate_type, bytes, &self.inner)?;
        let meta = envelope.metadata();
        if i64::try_from(meta.sequence).is_err() {
            return Err(OutboxError::Store(crate::StoreError::SequenceOutOfRange {
                aggregate_type: aggregate_type.to_owned(),
                aggregate_id: meta.aggregate_id.clone(),
                sequence: meta.sequence,
            }));
        }
        Ok(())
    }
}

/// Refuses what a store cannot keep the same way on every backend: U+0000 in the aggregate
/// type or id (PostgreSQL cannot store it in text), an envelope of `bytes` over
/// `max_envelope_bytes`.
fn storable(
    envelope: &dyn event_core::AnyEnvelope,
    aggregate_type: &str,
    bytes: usize,
    inner: &super::Inner,
) -> Result<(), OutboxError> {
    let meta = envelope.metadata();
    for (field, text) in [
        ("aggregate type", aggregate_type),
        ("aggregate id", meta.aggregate_id.as_str()),
    ] {
        if text.contains('\0') {
            return Err(OutboxError::Unstorable {
                event_id: meta.id,
                name: envelope.name(),
                field,
            });
        }
    }
    let limit = inner.config.max_envelope_bytes;
    if bytes > limit {
        return Err(OutboxError::TooLarge {
            event_id: meta.id,
            name: envelope.name(),
            bytes,
            limit,
        });
    }
    Ok(())
}
