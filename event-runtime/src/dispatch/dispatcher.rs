//! The in-process dispatcher: routes an envelope to its handlers by type id through a table
//! built once, guards against duplicates, isolates failures. Does no I/O of its own.

use std::any::{Any, TypeId};
use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use event_core::{
    AnyEnvelope, DecodeError, DeliveryMode, DomainEvent, Envelope, HandlerCall, HandlerContext,
    HandlerDescriptor, HandlerError, Metadata, RawEnvelope,
};
use futures_util::FutureExt;
use smallvec::SmallVec;

use crate::dispatch::guard::{Admission, IdempotencyGuard, Ticket, DEFAULT_GUARD_CAPACITY};
use crate::dispatch::registry::{Registry, RegistryBuilder, RegistryError, TypeIdMap};
use crate::dispatch::report::{DispatchReport, HandlerOutcome, Outcome, PanicMessage};
use crate::dispatch::uow::UnitOfWork;

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

struct BoundHandler {
    descriptor: &'static HandlerDescriptor,
    resources: Box<[Arc<dyn Any + Send + Sync>]>,
}

struct Inner {
    registry: Registry,
    handlers: Vec<BoundHandler>,
    /// Per event index: every handler is a plain `fn`, so dispatch needs no future.
    all_sync: Vec<bool>,
    resources: TypeIdMap<Arc<dyn Any + Send + Sync>>,
    guard: Option<IdempotencyGuard>,
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
    inner: Arc<Inner>,
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

/// Configures a [`Dispatcher`].
pub struct DispatcherBuilder {
    registry: RegistryBuilder,
    resources: TypeIdMap<(&'static str, Arc<dyn Any + Send + Sync>)>,
    guard_capacity: usize,
    transaction_types: Vec<TypeId>,
}

impl std::fmt::Debug for DispatcherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherBuilder")
            .field("registry", &self.registry)
            .field(
                "resources",
                &self.resources.values().map(|r| r.0).collect::<Vec<_>>(),
            )
            .field("guard_capacity", &self.guard_capacity)
            .finish()
    }
}

impl DispatcherBuilder {
    /// Provides a resource: handlers that take `&T` get this value. Replaces an earlier `T`.
    pub fn resource<T: Send + Sync + 'static>(self, value: T) -> Self {
        self.resource_arc(Arc::new(value))
    }

    /// Provides a resource the application keeps a handle to.
    pub fn resource_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.resources.insert(
            TypeId::of::<T>(),
            (
                std::any::type_name::<T>(),
                value as Arc<dyn Any + Send + Sync>,
            ),
        );
        self
    }

    /// Sets how many (handler, event id) pairs the idempotency guard remembers (default
    /// 10,000). `0` turns the guard off.
    pub fn idempotency_capacity(mut self, capacity: usize) -> Self {
        self.guard_capacity = capacity;
        self
    }

    /// Fails [`build`](Self::build) when fewer than `count` handlers are registered (handler
    /// crates dropped by the linker; see the crate docs, "Linking").
    pub fn expect_handlers(mut self, count: usize) -> Self {
        self.registry = self.registry.expect_handlers(count);
        self
    }

    /// Registers event type `E` by hand (in addition to `inventory`, or instead of it with
    /// [`Dispatcher::builder_empty`]).
    pub fn event<E: DomainEvent>(mut self) -> Self {
        self.registry = self.registry.event::<E>();
        self
    }

    /// Registers handler `H` by hand: `.handler::<my_handler>()`.
    pub fn handler<H: event_core::Handler>(mut self) -> Self {
        self.registry = self.registry.handler::<H>();
        self
    }

    /// Declares the transaction parameter types the runtime that runs this dispatcher can
    /// provide (the store-backed runtime calls this).
    pub(crate) fn provide_transactions(mut self, types: &[TypeId]) -> Self {
        self.transaction_types.extend_from_slice(types);
        self
    }

    /// Validates the registry and the resources and builds the dispatcher. Nothing is
    /// dispatched before this succeeds.
    ///
    /// # Errors
    /// Every [`RegistryError`]: duplicate (name, version), an upcast chain with a gap or a
    /// fork, a handler of an older version than the newest, duplicate handler names, fewer
    /// handlers than expected, a resource a handler takes that was not provided, a handler
    /// that needs a transaction.
    pub fn build(self) -> Result<Dispatcher, RegistryError> {
        let registry = self.registry.build()?;
        let mut handlers = Vec::with_capacity(registry.handlers().len());
        for &descriptor in registry.handlers() {
            if let Some(tx) = descriptor
                .transaction
                .filter(|t| !self.transaction_types.contains(&(t.type_id)()))
            {
                return Err(RegistryError::TransactionUnavailable {
                    handler: descriptor.name,
                    type_name: (tx.type_name)(),
                });
            }
            let resources = descriptor
                .resources
                .iter()
                .map(|r| {
                    self.resources
                        .get(&(r.type_id)())
                        .map(|(_, v)| Arc::clone(v))
                        .ok_or(RegistryError::MissingResource {
                            handler: descriptor.name,
                            type_name: (r.type_name)(),
                        })
                })
                .collect::<Result<_, _>>()?;
            handlers.push(BoundHandler {
                descriptor,
                resources,
            });
        }
        // An older version that must be upcast first takes the slow path too: the check costs
        // the events that need no upcast nothing.
        let all_sync = (0..registry.events().len())
            .map(|e| {
                registry.upcast_target(e).is_none()
                    && registry.handlers_of(e).iter().all(|&h| {
                        matches!(handlers[h as usize].descriptor.call, HandlerCall::Sync(_))
                    })
            })
            .collect();
        let guard = NonZeroUsize::new(self.guard_capacity).map(IdempotencyGuard::new);
        let resources = self
            .resources
            .into_iter()
            .map(|(k, (_, v))| (k, v))
            .collect();
        Ok(Dispatcher {
            inner: Arc::new(Inner {
                registry,
                handlers,
                all_sync,
                resources,
                guard,
            }),
        })
    }
}

/// The future of [`Dispatcher::dispatch`] and [`Dispatcher::dispatch_any`]: resolves to the
/// [`DispatchReport`].
///
/// When every handler of the event is a plain `fn`, the first poll runs them and is ready: no
/// state machine, no allocation. Otherwise it drives the `async fn` handlers in order.
#[must_use = "futures do nothing unless polled: `.await` the dispatch"]
pub struct Dispatch<'a> {
    dispatcher: &'a Dispatcher,
    event_type: TypeId,
    envelope: &'a (dyn Any + Send + Sync),
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

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<DispatchReport> {
        if self.slow.is_none() {
            let d = self.dispatcher;
            let Some(index) = d.inner.registry.event_index(self.event_type) else {
                return std::task::Poll::Ready(DispatchReport::new(self.meta, self.name));
            };
            if let Ok(report) =
                d.run_sync(index, self.envelope, self.meta, self.name, Phase::All, None)
            {
                return std::task::Poll::Ready(report);
            }
            let (envelope, erased) = (self.envelope, self.erased);
            let (meta, name) = (self.meta, self.name);
            self.slow = Some(Box::pin(d.run_async(
                index,
                envelope,
                erased,
                meta,
                name,
                Phase::All,
                None,
            )));
        }
        match &mut self.slow {
            Some(f) => f.as_mut().poll(cx),
            None => unreachable!("set above"),
        }
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
    /// ([`DecodeError::Payload`]). No handler runs then.
    pub async fn dispatch_raw(&self, raw: &RawEnvelope) -> Result<DispatchReport, DispatchError> {
        let envelope = self.inner.registry.decode(raw)?;
        Ok(self.dispatch_any(&*envelope).await)
    }

    /// Parses a CloudEvents JSON envelope and dispatches it.
    ///
    /// # Errors
    /// As [`dispatch_raw`](Self::dispatch_raw), plus [`DecodeError::Envelope`] for text that is
    /// not a CloudEvents 1.0 structured JSON event.
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
            envelope.as_any(),
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
        call(&self.inner.handlers[index as usize], envelope.as_any(), tx).await
    }

    /// Dispatches without a future when every handler of the event is a plain `fn` (the
    /// common case: nothing to poll, nothing to allocate). Gives `tx` back when the event has
    /// an `async fn` handler.
    #[inline(always)]
    fn run_sync<'t>(
        &self,
        index: usize,
        envelope: &(dyn Any + Send + Sync),
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        mut tx: Option<&'t mut (dyn TransactionSource + 'static)>,
    ) -> Result<DispatchReport, Option<&'t mut (dyn TransactionSource + 'static)>> {
        let inner = &*self.inner;
        if !inner.all_sync[index] {
            return Err(tx);
        }
        let mut report = DispatchReport::new(meta, name);
        for &h in inner.registry.handlers_of(index) {
            let bound = &inner.handlers[h as usize];
            if phase.skips(bound) {
                continue;
            }
            let HandlerCall::Sync(f) = bound.descriptor.call else {
                unreachable!("all_sync")
            };
            let outcome =
                self.guarded(h, meta, || call_sync(f, bound, envelope, tx.as_deref_mut()));
            report.push(bound, outcome, meta);
        }
        Ok(report)
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        event_type: TypeId,
        envelope: &(dyn Any + Send + Sync),
        erased: &dyn AnyEnvelope,
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> DispatchReport {
        let Some(index) = self.inner.registry.event_index(event_type) else {
            return DispatchReport::new(meta, name);
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
        mut envelope: &(dyn Any + Send + Sync),
        erased: &dyn AnyEnvelope,
        meta: &Metadata,
        name: &'static str,
        phase: Phase,
        mut tx: Option<&mut (dyn TransactionSource + 'static)>,
    ) -> DispatchReport {
        let inner = &*self.inner;
        let mut report = DispatchReport::new(meta, name);
        let upcast: Box<dyn AnyEnvelope>;
        if let Some(target) = inner.registry.upcast_target(index) {
            let handlers = inner.registry.handlers_of(target);
            if handlers
                .iter()
                .all(|&h| phase.skips(&inner.handlers[h as usize]))
            {
                return report; // none runs in this phase: no need to upcast
            }
            match inner.registry.upcast_ref(erased, index, target) {
                Ok(newer) => upcast = newer,
                // Only a descriptor built by hand can get here (the chain was validated):
                // every handler fails, permanently, with the reason.
                Err(e) => {
                    for &h in handlers {
                        let bound = &inner.handlers[h as usize];
                        if !phase.skips(bound) {
                            let error = HandlerError::permanent(e.to_string());
                            report.push(bound, Outcome::Failed(error), meta);
                        }
                    }
                    return report;
                }
            }
            envelope = upcast.as_any();
            index = target;
        }
        for &h in inner.registry.handlers_of(index) {
            let bound = &inner.handlers[h as usize];
            if phase.skips(bound) {
                continue;
            }
            let outcome = match self.admit(h, meta) {
                Admission::Duplicate => Outcome::Duplicate,
                Admission::Run(ticket) => {
                    let outcome = call(bound, envelope, tx.as_deref_mut()).await;
                    self.finish(ticket, h, meta, &outcome);
                    outcome
                }
            };
            report.push(bound, outcome, meta);
        }
        report
    }

    #[inline]
    fn admit(&self, handler: u32, meta: &Metadata) -> Admission {
        match &self.inner.guard {
            None => Admission::Run(Ticket::NONE),
            Some(guard) => guard.admit(handler, meta.id),
        }
    }

    #[inline]
    fn finish(&self, ticket: Ticket, handler: u32, meta: &Metadata, outcome: &Outcome) {
        if let Some(guard) = &self.inner.guard {
            guard.finish(ticket, handler, meta.id, matches!(outcome, Outcome::Ran));
        }
    }

    #[inline(always)]
    fn guarded(&self, handler: u32, meta: &Metadata, run: impl FnOnce() -> Outcome) -> Outcome {
        match self.admit(handler, meta) {
            Admission::Duplicate => Outcome::Duplicate,
            Admission::Run(ticket) => {
                let outcome = run();
                self.finish(ticket, handler, meta, &outcome);
                outcome
            }
        }
    }
}

impl Phase {
    #[inline]
    fn skips(self, bound: &BoundHandler) -> bool {
        matches!(self, Phase::Only(mode) if bound.descriptor.mode != mode)
    }
}

impl DispatchReport {
    #[inline]
    fn new(meta: &Metadata, name: &'static str) -> Self {
        DispatchReport {
            event_id: meta.id,
            event_name: name,
            outcomes: SmallVec::new(),
        }
    }

    #[inline]
    fn push(&mut self, bound: &BoundHandler, outcome: Outcome, meta: &Metadata) {
        if outcome.is_failure() {
            tracing::warn!(
                event = self.event_name,
                event_id = %meta.id,
                handler = bound.descriptor.name,
                "event handler {outcome}"
            );
        }
        self.outcomes.push(HandlerOutcome {
            handler: bound.descriptor.name,
            outcome,
        });
    }
}

fn transaction_for<'t>(
    bound: &BoundHandler,
    tx: Option<&'t mut (dyn TransactionSource + 'static)>,
) -> Option<&'t mut (dyn Any + Send)> {
    match (bound.descriptor.transaction, tx) {
        (Some(wanted), Some(source)) => source.param((wanted.type_id)()),
        _ => None,
    }
}

#[inline(always)]
fn call_sync(
    f: fn(&mut HandlerContext<'_>) -> Result<(), HandlerError>,
    bound: &BoundHandler,
    envelope: &(dyn Any + Send + Sync),
    tx: Option<&mut (dyn TransactionSource + 'static)>,
) -> Outcome {
    let mut ctx = HandlerContext::new(envelope, &bound.resources, transaction_for(bound, tx));
    outcome(std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut ctx))))
}

fn outcome(result: Result<Result<(), HandlerError>, Box<dyn Any + Send>>) -> Outcome {
    match result {
        Ok(Ok(())) => Outcome::Ran,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(payload) => Outcome::Panicked(PanicMessage::new(panic_message(&*payload))),
    }
}

async fn call(
    bound: &BoundHandler,
    envelope: &(dyn Any + Send + Sync),
    tx: Option<&mut (dyn TransactionSource + 'static)>,
) -> Outcome {
    match bound.descriptor.call {
        HandlerCall::Sync(f) => call_sync(f, bound, envelope, tx),
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
