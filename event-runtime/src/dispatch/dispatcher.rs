//! The in-process dispatcher: routes an envelope to its handlers by type id through a table
//! built once, guards against duplicates, isolates failures. Does no I/O of its own.

use std::any::{Any, TypeId};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use event_core::{
    AnyEnvelope, DecodeError, DeliveryMode, DomainEvent, Envelope, EnvelopeRef, HandlerCall,
    HandlerContext, HandlerDescriptor, HandlerError, Metadata, RawEnvelope,
};
use futures_util::FutureExt;
use uuid::Uuid;

use crate::dispatch::guard::{Admission, IdempotencyGuard, Ticket, DEFAULT_GUARD_CAPACITY};
use crate::dispatch::registry::{Registry, RegistryBuilder, TypeIdMap};
use crate::dispatch::report::{DispatchReport, HandlerNames, Outcome, PanicMessage, Tally};
use crate::dispatch::uow::UnitOfWork;
use crate::schema::validate::SchemaValidator;
use crate::schema::SchemaViolation;

pub use super::builder::DispatcherBuilder;
use super::table::{BoundHandler, Route, TypeTable};

/// Which handlers of an event a dispatch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    All,
    Only(DeliveryMode),
}

/// Something that can hand a handler its transaction parameter: the store's transaction,
/// viewed as whichever type the handler asks for.
pub(crate) trait TransactionSource: Send {
    /// The transaction as the type `type_id`, if this source can provide it.
    fn param(&mut self, type_id: TypeId) -> Option<&mut (dyn Any + Send)>;
}

pub(super) struct Inner {
    pub(super) registry: Registry,
    /// Per registry handler index (durable delivery calls one handler at a time).
    pub(super) handlers: Vec<BoundHandler>,
    pub(super) types: TypeTable,
    /// Per event index.
    pub(super) routes: Vec<Route>,
    pub(super) resources: TypeIdMap<Arc<dyn Any + Send + Sync>>,
    pub(super) guard: Option<IdempotencyGuard>,
    pub(super) validator: Option<SchemaValidator>,
}

/// Routes events to their handlers, in process.
///
/// Built once at start-up with [`Dispatcher::builder`]; cheap to clone (an `Arc`), `Send` and
/// `Sync`. Each handler of an event runs in order (priority, then name) even when another one
/// fails or panics, and the [`DispatchReport`] says what happened to each.
///
/// The idempotency guard (on by default, 10,000 entries) remembers (handler name, event id)
/// pairs that succeeded: dispatching the same envelope again skips those handlers and reports
/// them as [`Outcome::Duplicate`]. A handler that failed is not remembered, so dispatching
/// again retries it. The guard is in memory and bounded: it absorbs redeliveries that arrive
/// while the pair is still among the most recent `capacity`; durable deduplication across
/// restarts is the store's job.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use event_core::{event_handler, DomainEvent, Envelope};
/// use event_runtime::Dispatcher;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "cart.checked_out", version = 1)]
/// struct CheckedOut { #[event(aggregate_id)] cart: u64 }
///
/// #[derive(Default)]
/// struct Counter(AtomicU32);
///
/// #[event_handler]
/// fn count(_: &CheckedOut, counter: &Counter) {
///     counter.0.fetch_add(1, Ordering::Relaxed);
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dispatcher = Dispatcher::builder().resource(Counter::default()).build()?;
/// let envelope = Envelope::new(CheckedOut { cart: 7 });
/// let first = dispatcher.dispatch(&envelope).await;
/// let again = dispatcher.dispatch(&envelope).await; // an at-least-once redelivery
/// assert_eq!((first.ran(), again.duplicates()), (1, 1));
/// assert_eq!(dispatcher.resource::<Counter>().unwrap().0.load(Ordering::Relaxed), 1);
/// # Ok::<(), event_runtime::RegistryError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Dispatcher {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("events", &self.inner.registry.events().len())
            .field("handlers", &self.inner.handlers.len())
            .field("guard_capacity", &self.guard_capacity())
            .finish()
    }
}

/// The future of [`Dispatcher::dispatch`] and [`Dispatcher::dispatch_any`]: resolves to the
/// [`DispatchReport`].
///
/// When every handler of the event is a plain `fn`, the first poll runs them and is ready: no
/// state machine, no allocation (with the guard off or on). Otherwise it drives the `async fn`
/// handlers in order, in a boxed future.
#[must_use = "futures do nothing unless polled: `.await` the dispatch"]
pub struct Dispatch<'a> {
    dispatcher: &'a Dispatcher,
    event_type: TypeId,
    /// The envelope and its type id (not the event's), kept apart: see [`Dispatch::envelope`].
    envelope: &'a (dyn Any + Send + Sync),
    envelope_type: TypeId,
    /// The same envelope, to upcast it when the handlers take a newer version.
    erased: &'a dyn AnyEnvelope,
    meta: &'a Metadata,
    name: &'static str,
    slow: Option<std::pin::Pin<Box<dyn std::future::Future<Output = DispatchReport> + Send + 'a>>>,
}

impl std::fmt::Debug for Dispatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch")
            .field("event", &self.name)
            .field("event_id", &self.meta.id)
            .finish_non_exhaustive()
    }
}

impl<'a> std::future::Future for Dispatch<'a> {
    type Output = DispatchReport;

    // Inlined where it is awaited: the hot path is short, and inlined it builds the report in
    // place instead of copying it out of a callee's frame. Everything else is in
    // `poll_first`, out of line.
    #[inline(always)]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<DispatchReport> {
        if let Some(slow) = &mut self.slow {
            return slow.as_mut().poll(cx);
        }
        let inner = &*self.dispatcher.inner;
        let Some(index) = inner.types.get(self.event_type) else {
            return std::task::Poll::Ready(empty_report(self.meta, self.name));
        };
        let route = &inner.routes[index];
        if route.all_sync {
            let (handlers, envelope, meta, name) =
                (&route.all, self.envelope(), self.meta, self.name);
            // One loop per guard kind, so that a dispatcher without a guard pays nothing for it.
            let tally = match &inner.guard {
                None => run_handlers(&NoGuard, handlers, 0, envelope, meta, name, None),
                Some(guard) => run_handlers(guard, handlers, 0, envelope, meta, name, None),
            };
            return std::task::Poll::Ready(tally.report(meta.id, name, route.names));
        }
        self.poll_first(index, cx)
    }
}

impl<'a> Dispatch<'a> {
    /// The envelope with its type id, assembled where it is used: stored whole in the future,
    /// the 32-byte struct is copied out with 16-byte loads of what two 8-byte stores wrote
    /// just before (the fat pointer), which stalls on store forwarding (about 7 ns of a 20 ns
    /// dispatch, measured with `perf` on an AMD EPYC host).
    #[inline(always)]
    fn envelope(&self) -> EnvelopeRef<'a> {
        // SAFETY: `envelope_type` is the type id of `envelope`'s concrete type: `dispatch`
        // sets `Envelope<E>`'s for an `&Envelope<E>`, `dispatch_any` reads it from the
        // value's vtable; both fields are private and never changed.
        unsafe { EnvelopeRef::from_parts_unchecked(self.envelope, self.envelope_type) }
    }

    /// The first poll of a dispatch with `async fn` handlers (or an envelope to upcast).
    #[inline(never)]
    fn poll_first(
        &mut self,
        index: usize,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<DispatchReport> {
        let d = self.dispatcher;
        let (envelope, erased) = (self.envelope(), self.erased);
        let (meta, name) = (self.meta, self.name);
        let slow = self.slow.insert(Box::pin(d.run_async(
            index,
            envelope,
            erased,
            meta,
            name,
            Phase::All,
            None,
        )));
        slow.as_mut().poll(cx)
    }
}

/// Errors of [`Dispatcher::dispatch_raw`] and [`Dispatcher::dispatch_json`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The envelope could not be decoded: malformed, unknown name or version, or a payload
    /// that does not fit the type. No handler ran.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Schema validation is on ([`DispatcherBuilder::validate_schemas`]) and the payload does
    /// not match the JSON Schema of its (name, version). No handler ran.
    #[error(transparent)]
    Invalid(#[from] SchemaViolation),
}

impl Dispatcher {
    /// A builder over every event and handler registered through `inventory`.
    pub fn builder() -> DispatcherBuilder {
        Self::builder_from(Registry::from_inventory())
    }

    /// A builder with nothing registered: add events and handlers with
    /// [`DispatcherBuilder::event`] and [`DispatcherBuilder::handler`].
    pub fn builder_empty() -> DispatcherBuilder {
        Self::builder_from(Registry::builder())
    }

    /// A builder over a registry builder of your own.
    pub fn builder_from(registry: RegistryBuilder) -> DispatcherBuilder {
        DispatcherBuilder {
            registry,
            resources: TypeIdMap::default(),
            guard_capacity: DEFAULT_GUARD_CAPACITY,
            transaction_types: Vec::new(),
            validate_schemas: false,
        }
    }

    /// The validated registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The resource of type `T`, if one was provided.
    pub fn resource<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.inner
            .resources
            .get(&TypeId::of::<T>())
            .and_then(|r| r.downcast_ref::<T>())
    }

    /// The guard's capacity; 0 when it is off.
    pub fn guard_capacity(&self) -> usize {
        self.inner
            .guard
            .as_ref()
            .map_or(0, IdempotencyGuard::capacity)
    }

    /// How many (handler, event id) pairs the guard remembers now.
    pub fn guard_len(&self) -> usize {
        self.inner.guard.as_ref().map_or(0, IdempotencyGuard::len)
    }

    /// Whether envelopes from outside the process are validated against their JSON Schema
    /// ([`DispatcherBuilder::validate_schemas`]).
    pub fn validates_schemas(&self) -> bool {
        self.inner.validator.is_some()
    }

    /// Checks the payload of `raw` against the JSON Schema of its (name, version), as
    /// [`dispatch_raw`](Self::dispatch_raw) and the inbox do. `Ok` when validation is off, and
    /// for an event type without a schema or unknown to the registry (decoding decides then).
    ///
    /// # Errors
    /// The first [`SchemaViolation`].
    pub fn validate(&self, raw: &RawEnvelope) -> Result<(), SchemaViolation> {
        match &self.inner.validator {
            Some(v) => v.check(raw),
            None => Ok(()),
        }
    }

    /// A unit of work over this dispatcher.
    pub fn unit_of_work(&self) -> UnitOfWork<'_> {
        UnitOfWork::new(self)
    }

    /// Runs every handler of `E` on `envelope`, in order, when the returned future is
    /// polled. Never fails as a whole: each handler's outcome is in the report. A type with no
    /// handlers gives an empty report.
    ///
    /// When `E` is an older version of an event, the handlers of its newest version run, on a
    /// copy of the envelope upcast step by step (v1 → v2 → v3) with the same metadata; handlers
    /// never take an older version than the newest (checked at start-up).
    pub fn dispatch<'a, E: DomainEvent>(&'a self, envelope: &'a Envelope<E>) -> Dispatch<'a> {
        Dispatch {
            dispatcher: self,
            event_type: TypeId::of::<E>(),
            envelope,
            envelope_type: TypeId::of::<Envelope<E>>(),
            erased: envelope,
            meta: envelope.metadata(),
            name: E::NAME,
            slow: None,
        }
    }

    /// Runs every handler of a type-erased envelope (from an [`event_core::EventRecorder`] or
    /// [`Registry::decode`]).
    pub fn dispatch_any<'a>(&'a self, envelope: &'a dyn AnyEnvelope) -> Dispatch<'a> {
        Dispatch {
            dispatcher: self,
            event_type: envelope.event_type_id(),
            envelope: envelope.as_any(),
            envelope_type: Any::type_id(envelope.as_any()),
            erased: envelope,
            meta: envelope.metadata(),
            name: envelope.name(),
            slow: None,
        }
    }

    /// Decodes `raw` through the registry by (name, version) and dispatches it (an older
    /// version is upcast to the one the handlers take, as in [`dispatch`](Self::dispatch)).
    ///
    /// # Errors
    /// [`DispatchError::Decode`] for an unknown name ([`DecodeError::UnknownName`]) or version
    /// ([`DecodeError::UnknownVersion`]) or a payload that does not fit the type
    /// ([`DecodeError::Payload`]); with schema validation on, [`DispatchError::Invalid`] for
    /// a payload that breaks its JSON Schema. No handler runs then.
    ///
    /// # Cancel safety
    /// As the [`Dispatch`] future: dropped before it completes, the handlers that had not
    /// started do not run and a handler that was running is dropped at its await point
    /// (its idempotency reservation is released, so a redelivery runs it again).
    pub async fn dispatch_raw(&self, raw: &RawEnvelope) -> Result<DispatchReport, DispatchError> {
        self.validate(raw)?;
        let envelope = self.inner.registry.decode(raw)?;
        Ok(self.dispatch_any(&*envelope).await)
    }

    /// Parses a CloudEvents JSON envelope and dispatches it.
    ///
    /// # Errors
    /// As [`dispatch_raw`](Self::dispatch_raw), plus [`DecodeError::Envelope`] for text that is
    /// not a CloudEvents 1.0 structured JSON event.
    ///
    /// # Cancel safety
    /// As [`dispatch_raw`](Self::dispatch_raw).
    pub async fn dispatch_json(&self, json: &str) -> Result<DispatchReport, DispatchError> {
        let raw = RawEnvelope::from_json(json)?;
        self.dispatch_raw(&raw).await
    }

    pub(crate) async fn dispatch_phase(
        &self,
        envelope: &dyn AnyEnvelope,
        phase: Phase,
        tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> DispatchReport {
        self.run(
            envelope.event_type_id(),
            EnvelopeRef::new(envelope.as_any()),
            envelope,
            envelope.metadata(),
            envelope.name(),
            phase,
            tx,
        )
        .await
    }

    /// The index of the handler named `name`.
    pub(crate) fn handler_index(&self, name: &str) -> Option<u32> {
        self.inner
            .handlers
            .iter()
            .position(|h| h.descriptor.name == name)
            .map(|i| i as u32)
    }

    pub(crate) fn handler_descriptor(&self, index: u32) -> &'static HandlerDescriptor {
        self.inner.handlers[index as usize].descriptor
    }

    /// Runs one handler on one envelope, without the in-memory guard (durable delivery
    /// deduplicates in the store).
    pub(crate) async fn call_one(
        &self,
        index: u32,
        envelope: &dyn AnyEnvelope,
        tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> Outcome {
        call(
            &self.inner.handlers[index as usize],
            EnvelopeRef::new(envelope.as_any()),
            tx,
        )
        .await
    }

    /// Dispatches without a future when every handler of the event is a plain `fn` (the
    /// common case: nothing to poll, nothing to allocate). Gives `tx` back when the event has
    /// an `async fn` handler.
    #[inline(always)]
    fn run_sync<'t>(
        &self,
        index: usize,
        envelope: EnvelopeRef<'_>,
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        tx: Option<&'t mut (dyn TransactionSource + 'static)>,
    ) -> Result<DispatchReport, Option<&'t mut (dyn TransactionSource + 'static)>> {
        let inner = &*self.inner;
        let route = &inner.routes[index];
        if !route.all_sync {
            return Err(tx);
        }
        let (handlers, first, names) = route.phase(phase);
        // One loop per guard kind, so that a dispatcher without a guard pays nothing for it.
        let tally = match &inner.guard {
            None => run_handlers(&NoGuard, handlers, first, envelope, meta, name, tx),
            Some(guard) => run_handlers(guard, handlers, first, envelope, meta, name, tx),
        };
        Ok(tally.report(meta.id, name, names))
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        event_type: TypeId,
        envelope: EnvelopeRef<'_>,
        erased: &dyn AnyEnvelope,
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> DispatchReport {
        let Some(index) = self.inner.types.get(event_type) else {
            return empty_report(meta, name);
        };
        match self.run_sync(index, envelope, meta, name, phase, tx) {
            Ok(report) => report,
            // Boxed so that the future of a dispatch without async handlers stays small.
            Err(tx) => {
                Box::pin(self.run_async(index, envelope, erased, meta, name, phase, tx)).await
            }
        }
    }

    /// Runs the handlers one after another, awaiting `async fn` ones. An envelope of an older
    /// version is first upcast (a copy, step by step) to the version the handlers take.
    #[allow(clippy::too_many_arguments)]
    async fn run_async(
        &self,
        mut index: usize,
        mut envelope: EnvelopeRef<'_>,
        erased: &dyn AnyEnvelope,
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        mut tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> DispatchReport {
        let inner = &*self.inner;
        let upcast: Box<dyn AnyEnvelope>;
        if let Some(target) = inner.registry.upcast_target(index) {
            let (handlers, first, names) = inner.routes[target].phase(phase);
            if handlers.is_empty() {
                // None runs in this phase: no need to upcast.
                return DispatchReport::new(meta.id, name, names);
            }
            match inner.registry.upcast_ref(erased, index, target) {
                Ok(newer) => upcast = newer,
                // Only a descriptor built by hand can get here (the chain was validated):
                // every handler fails, permanently, with the reason.
                Err(e) => {
                    let mut tally = Tally::default();
                    for (position, bound) in (first..).zip(handlers) {
                        let outcome = Outcome::Failed(HandlerError::permanent(e.to_string()));
                        log_failure(name, bound, &outcome, meta);
                        tally.record(position, outcome);
                    }
                    return tally.report(meta.id, name, names);
                }
            }
            envelope = EnvelopeRef::new(upcast.as_any());
            index = target;
        }
        let (handlers, first, names) = inner.routes[index].phase(phase);
        let mut tally = Tally::default();
        for (position, bound) in (first..).zip(handlers) {
            match self.admit(bound.index, meta) {
                Admission::Duplicate => tally.duplicate(position),
                Admission::Run(ticket) => {
                    // Dropped while the handler awaits (a cancelled dispatch), the
                    // reservation is released as after a failure, so that a redelivery runs
                    // the handler rather than taking it for a duplicate.
                    let mut reservation = Reservation {
                        dispatcher: self,
                        ticket: Some(ticket),
                        handler: bound.index,
                        meta,
                    };
                    let outcome = call(bound, envelope, tx.as_deref_mut()).await;
                    let succeeded = matches!(outcome, Outcome::Ran);
                    if let Some(ticket) = reservation.ticket.take() {
                        self.finish(ticket, bound.index, meta, succeeded);
                    }
                    if !succeeded {
                        log_failure(name, bound, &outcome, meta);
                    }
                    tally.record(position, outcome);
                }
            }
        }
        tally.report(meta.id, name, names)
    }

    #[inline(always)]
    fn admit(&self, handler: u32, meta: &Metadata) -> Admission {
        match &self.inner.guard {
            None => Admission::Run(Ticket::NONE),
            Some(guard) => guard.admit(handler, meta.id),
        }
    }

    #[inline(always)]
    fn finish(&self, ticket: Ticket, handler: u32, meta: &Metadata, succeeded: bool) {
        if let Some(guard) = &self.inner.guard {
            guard.finish(ticket, handler, meta.id, succeeded);
        }
    }
}

/// The guard as the dispatch loop of plain `fn` handlers sees it.
trait Guard {
    fn admit(&self, handler: u32, event: Uuid) -> Admission;
    fn finish(&self, ticket: Ticket, handler: u32, event: Uuid, succeeded: bool);
}

/// The guard turned off: the checks compile away.
struct NoGuard;

impl Guard for NoGuard {
    #[inline(always)]
    fn admit(&self, _: u32, _: Uuid) -> Admission {
        Admission::Run(Ticket::NONE)
    }
    #[inline(always)]
    fn finish(&self, _: Ticket, _: u32, _: Uuid, _: bool) {}
}

impl Guard for IdempotencyGuard {
    #[inline(always)]
    fn admit(&self, handler: u32, event: Uuid) -> Admission {
        IdempotencyGuard::admit(self, handler, event)
    }
    #[inline(always)]
    fn finish(&self, ticket: Ticket, handler: u32, event: Uuid, succeeded: bool) {
        IdempotencyGuard::finish(self, ticket, handler, event, succeeded)
    }
}

/// An idempotency reservation held across an await: released as a failure when dropped
/// before it was finished.
struct Reservation<'a> {
    dispatcher: &'a Dispatcher,
    ticket: Option<Ticket>,
    handler: u32,
    meta: &'a Metadata,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.dispatcher
                .finish(ticket, self.handler, self.meta, false);
        }
    }
}

/// Runs plain `fn` handlers in order, each isolated (a panic is caught), through `guard`.
#[inline(always)]
fn run_handlers(
    guard: &impl Guard,
    handlers: &[BoundHandler],
    first: u32,
    envelope: EnvelopeRef<'_>,
    meta: &Metadata,
    name: &'static str,
    mut tx: Option<&mut (dyn TransactionSource + 'static)>,
) -> Tally {
    let mut tally = Tally::default();
    for (position, bound) in (first..).zip(handlers) {
        let HandlerCall::Sync(f) = bound.call else {
            unreachable!("all_sync")
        };
        let ticket = match guard.admit(bound.index, meta.id) {
            Admission::Duplicate => {
                tally.duplicate(position);
                continue;
            }
            Admission::Run(ticket) => ticket,
        };
        match call_sync(f, bound, envelope, tx.as_deref_mut()) {
            Ok(Ok(())) => {
                guard.finish(ticket, bound.index, meta.id, true);
                tally.ran(position);
            }
            other => {
                guard.finish(ticket, bound.index, meta.id, false);
                let outcome = outcome(other);
                log_failure(name, bound, &outcome, meta);
                tally.record(position, outcome);
            }
        }
    }
    tally
}

/// The report of an event that has no handlers here.
fn empty_report(meta: &Metadata, name: &'static str) -> DispatchReport {
    DispatchReport::new(meta.id, name, HandlerNames::empty())
}

/// Logs a failed or panicked handler: out of line, so that the success path stays short.
#[cold]
#[inline(never)]
fn log_failure(event: &'static str, bound: &BoundHandler, outcome: &Outcome, meta: &Metadata) {
    tracing::warn!(
        event,
        event_id = %meta.id,
        handler = bound.descriptor.name,
        "event handler {outcome}"
    );
}

/// The transaction as the type `bound` takes, if it takes one. Inlined: without a transaction
/// (a plain dispatch) this folds away.
#[inline(always)]
fn transaction_for<'t>(
    bound: &BoundHandler,
    tx: Option<&'t mut (dyn TransactionSource + 'static)>,
) -> Option<&'t mut (dyn Any + Send)> {
    match (bound.descriptor.transaction, tx) {
        (Some(wanted), Some(source)) => source.param((wanted.type_id)()),
        _ => None,
    }
}

/// What a plain `fn` handler did: returned, or panicked with this payload.
type SyncResult = Result<Result<(), HandlerError>, Box<dyn Any + Send>>;

/// Calls a plain `fn` handler, catching a panic. The caller turns anything but `Ok(Ok(()))`
/// into an [`Outcome`] out of line.
#[inline(always)]
fn call_sync(
    f: fn(&mut HandlerContext<'_>) -> Result<(), HandlerError>,
    bound: &BoundHandler,
    envelope: EnvelopeRef<'_>,
    tx: Option<&mut (dyn TransactionSource + 'static)>,
) -> SyncResult {
    let mut ctx = HandlerContext::new(envelope, &bound.resources, transaction_for(bound, tx));
    std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut ctx)))
}

fn outcome(result: SyncResult) -> Outcome {
    match result {
        Ok(Ok(())) => Outcome::Ran,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(payload) => Outcome::Panicked(PanicMessage::new(panic_message(&*payload))),
    }
}

async fn call(
    bound: &BoundHandler,
    envelope: EnvelopeRef<'_>,
    tx: Option<&mut (dyn TransactionSource + 'static)>,
) -> Outcome {
    match bound.call {
        HandlerCall::Sync(f) => outcome(call_sync(f, bound, envelope, tx)),
        HandlerCall::Async(f) => {
            let mut ctx =
                HandlerContext::new(envelope, &bound.resources, transaction_for(bound, tx));
            outcome(AssertUnwindSafe(f(&mut ctx)).catch_unwind().await)
        }
    }
}

/// The message of a panic payload (`panic!("…")` gives `&str` or `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}
