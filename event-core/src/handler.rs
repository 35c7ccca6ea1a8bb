//! What `#[event_handler]` produces: a [`HandlerDescriptor`] with a type-erased entry point,
//! and the [`HandlerContext`] the runtime calls it with. Running handlers is the runtime's job.

use std::any::{Any, TypeId};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::envelope::Envelope;
use crate::error::HandlerError;
use crate::event::{DomainEvent, EventDescriptor};

/// When a handler runs relative to the commit of the unit of work that recorded the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeliveryMode {
    /// After COMMIT, through durable delivery: retried, dead-lettered, at-least-once. The
    /// default.
    #[default]
    AfterCommit,
    /// Inside the open transaction, before COMMIT: an error aborts the whole commit. Set with
    /// `#[event_handler(in_transaction)]`.
    InTransaction,
}

/// A parameter type a handler asks the runtime for.
#[derive(Clone, Copy)]
pub struct ResourceDescriptor {
    /// The Rust type name, for error messages (a function so that it can sit in a `static`).
    pub type_name: fn() -> &'static str,
    /// The Rust type id, the lookup key.
    pub type_id: fn() -> TypeId,
}

impl ResourceDescriptor {
    /// The descriptor of `T`.
    pub const fn of<T: ?Sized + 'static>() -> Self {
        ResourceDescriptor {
            type_name: std::any::type_name::<T>,
            type_id: TypeId::of::<T>,
        }
    }
}

impl fmt::Debug for ResourceDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str((self.type_name)())
    }
}

/// A boxed, `Send` future borrowing the handler context.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// A handler's type-erased entry point.
#[derive(Clone, Copy)]
pub enum HandlerCall {
    /// A plain `fn`: called inline, no allocation.
    Sync(fn(&mut HandlerContext<'_>) -> Result<(), HandlerError>),
    /// An `async fn`: its future is boxed.
    Async(for<'a, 'b> fn(&'a mut HandlerContext<'b>) -> HandlerFuture<'a>),
}

/// Everything the runtime knows about one handler.
///
/// `#[event_handler]` builds one as a `static` and submits it to `inventory`; the same static is
/// reachable for explicit registration through the type of the same name the macro emits.
#[derive(Clone, Copy)]
pub struct HandlerDescriptor {
    /// Stable identity, the first half of the idempotency key: `name = "…"`, or the module
    /// path and function name (`my_crate::billing::on_order_placed`).
    pub name: &'static str,
    /// The descriptors of the event types the handler takes: one for a handler of `&E`, one
    /// per variant, in declaration order, for a handler of an event union
    /// ([`derive@crate::EventUnion`]).
    pub events: &'static [fn() -> EventDescriptor],
    /// Lower runs first; ties are broken by `name`.
    pub priority: i32,
    /// Delivery mode.
    pub mode: DeliveryMode,
    /// Whether durable delivery keeps per-aggregate order for this handler (the default;
    /// `#[event_handler(unordered)]` turns it off).
    pub ordered: bool,
    /// The `&T` resources the handler takes after the event, in parameter order.
    pub resources: &'static [ResourceDescriptor],
    /// The `&mut T` transaction or connection parameter, if any.
    pub transaction: Option<ResourceDescriptor>,
    /// Whether the handler takes `&Envelope<E>` (true) or `&E` (false).
    pub takes_envelope: bool,
    /// The entry point.
    pub call: HandlerCall,
    /// Source file of the handler.
    pub file: &'static str,
    /// Line of the handler in `file`.
    pub line: u32,
}

impl fmt::Debug for HandlerDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let events: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                let e = e();
                format!("{} v{}", e.name, e.version)
            })
            .collect();
        f.debug_struct("HandlerDescriptor")
            .field("name", &self.name)
            .field("events", &events)
            .field("priority", &self.priority)
            .field("mode", &self.mode)
            .field("ordered", &self.ordered)
            .field("resources", &self.resources)
            .field("transaction", &self.transaction)
            .field("location", &format_args!("{}:{}", self.file, self.line))
            .finish()
    }
}

/// A borrowed envelope behind `Any`, with its type id read once.
///
/// The runtime builds one per dispatch and hands it to every handler of the event, so that a
/// handler finding its `Envelope<E>` compares two type ids instead of making a virtual call
/// (`<dyn Any>::downcast_ref` asks the value's vtable for its type every time).
#[derive(Clone, Copy)]
pub struct EnvelopeRef<'a> {
    value: &'a (dyn Any + Send + Sync),
    type_id: TypeId,
}

impl<'a> EnvelopeRef<'a> {
    /// Borrows `value` (an `Envelope<E>`, or anything a hand-written test wants to pass) with
    /// its type known statically: no virtual call.
    #[inline(always)]
    pub fn of<T: Any + Send + Sync>(value: &'a T) -> Self {
        EnvelopeRef {
            value,
            type_id: TypeId::of::<T>(),
        }
    }

    /// Borrows a type-erased `value`, asking its vtable for its type once.
    #[inline]
    pub fn new(value: &'a (dyn Any + Send + Sync)) -> Self {
        EnvelopeRef {
            value,
            type_id: Any::type_id(value),
        }
    }

    /// Borrows `value` whose type id the caller already holds (the runtime keeps the two
    /// apart in its dispatch future, where a 32-byte copy of this struct would be slower
    /// than two register pairs).
    ///
    /// # Safety
    /// `type_id` must be the type id of `value`'s concrete type (`Any::type_id(value)`).
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn from_parts_unchecked(
        value: &'a (dyn Any + Send + Sync),
        type_id: TypeId,
    ) -> Self {
        EnvelopeRef { value, type_id }
    }

    /// The type id of the borrowed value.
    #[inline(always)]
    pub fn type_id(&self) -> TypeId {
        self.type_id
    }

    /// The borrowed value.
    #[inline(always)]
    pub fn as_any(&self) -> &'a (dyn Any + Send + Sync) {
        self.value
    }

    /// The value as `&T`, when it is one.
    #[inline(always)]
    pub fn downcast<T: Any>(&self) -> Option<&'a T> {
        if self.type_id == TypeId::of::<T>() {
            // SAFETY: `type_id` is the type id of `value`'s concrete type: the safe
            // constructors read it from the value itself (`TypeId::of::<T>()` of a `&T`, or
            // its vtable), `from_parts_unchecked` requires it, and the fields are private. Equal ids mean the value is a `T`, so the data
            // pointer of the trait object points to a valid `T` for `'a` (what
            // `<dyn Any>::downcast_ref` does after its own comparison).
            Some(unsafe { &*(self.value as *const (dyn Any + Send + Sync) as *const T) })
        } else {
            None
        }
    }
}

impl fmt::Debug for EnvelopeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvelopeRef")
            .field("type_id", &self.type_id)
            .finish_non_exhaustive()
    }
}

impl<'a, T: Any + Send + Sync> From<&'a T> for EnvelopeRef<'a> {
    #[inline(always)]
    fn from(value: &'a T) -> Self {
        EnvelopeRef::of(value)
    }
}

impl<'a> From<&'a (dyn Any + Send + Sync)> for EnvelopeRef<'a> {
    #[inline]
    fn from(value: &'a (dyn Any + Send + Sync)) -> Self {
        EnvelopeRef::new(value)
    }
}

/// A resource as the runtime holds it for handlers: shared, with its type id read once when
/// it was bound, so that handing it to a handler is a comparison rather than a virtual call.
#[derive(Clone)]
pub struct BoundResource {
    value: Arc<dyn Any + Send + Sync>,
    /// `value`'s data pointer, read once (finding it in an `Arc<dyn Any>` reads the vtable's
    /// alignment).
    data: *const (),
    type_id: TypeId,
}

// SAFETY: `data` points into `value`, which is `Send + Sync` and owned by the same struct;
// the pointer is only ever read as a shared reference to that value.
unsafe impl Send for BoundResource {}
// SAFETY: as for `Send`.
unsafe impl Sync for BoundResource {}

impl BoundResource {
    /// Binds `value`, reading its type once.
    pub fn new(value: Arc<dyn Any + Send + Sync>) -> Self {
        let type_id = Any::type_id(&*value);
        let data = Arc::as_ptr(&value) as *const ();
        BoundResource {
            value,
            data,
            type_id,
        }
    }

    /// The shared value.
    pub fn value(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.value
    }

    /// The value as `&T`, when it is one.
    #[inline(always)]
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        if self.type_id == TypeId::of::<T>() {
            // SAFETY: `type_id` was read from the value itself in `new` (its vtable), and the
            // fields are private: equal ids mean `data` (the `Arc`'s data pointer, which never
            // moves) points to a `T`, kept alive by `value` as long as `self` is borrowed.
            Some(unsafe { &*(self.data as *const T) })
        } else {
            None
        }
    }
}

impl fmt::Debug for BoundResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundResource")
            .field("type_id", &self.type_id)
            .finish_non_exhaustive()
    }
}

impl From<Arc<dyn Any + Send + Sync>> for BoundResource {
    fn from(value: Arc<dyn Any + Send + Sync>) -> Self {
        BoundResource::new(value)
    }
}

/// What a handler is called with: the envelope, the resources resolved for it at start-up,
/// and the open transaction when there is one.
pub struct HandlerContext<'a> {
    envelope: EnvelopeRef<'a>,
    resources: &'a [BoundResource],
    transaction: Option<&'a mut (dyn Any + Send)>,
}

impl<'a> HandlerContext<'a> {
    /// A context over `envelope` (an `Envelope<E>`: `&envelope`, a `&dyn Any`, or an
    /// [`EnvelopeRef`]), the handler's resources in parameter order, and an optional
    /// transaction.
    #[inline(always)]
    pub fn new(
        envelope: impl Into<EnvelopeRef<'a>>,
        resources: &'a [BoundResource],
        transaction: Option<&'a mut (dyn Any + Send)>,
    ) -> Self {
        HandlerContext {
            envelope: envelope.into(),
            resources,
            transaction,
        }
    }

    /// The envelope as `Envelope<E>`, when it is one: how an event union finds its variant.
    #[inline(always)]
    pub fn try_envelope<E: DomainEvent>(&self) -> Option<&'a Envelope<E>> {
        self.envelope.downcast::<Envelope<E>>()
    }

    /// The envelope as `Envelope<E>`.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when the envelope is of another type (a runtime bug: the
    /// registry routes by type id).
    #[inline(always)]
    pub fn envelope<E: DomainEvent>(&self) -> Result<&'a Envelope<E>, HandlerError> {
        match self.envelope.downcast::<Envelope<E>>() {
            Some(e) => Ok(e),
            None => Err(wrong_envelope::<E>()),
        }
    }

    /// The resource at `index` (parameter order) as `&T`.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when it is missing or of another type (the registry checks
    /// this at start-up).
    #[inline(always)]
    pub fn resource<T: Send + Sync + 'static>(&self, index: usize) -> Result<&'a T, HandlerError> {
        match self
            .resources
            .get(index)
            .and_then(|r| r.downcast_ref::<T>())
        {
            Some(r) => Ok(r),
            None => Err(missing_resource::<T>()),
        }
    }

    /// Takes the transaction as `&mut T`. Can be called once.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when there is no open transaction of type `T`.
    pub fn take_transaction<T: Send + 'static>(&mut self) -> Result<&'a mut T, HandlerError> {
        self.transaction
            .take()
            .and_then(|t| t.downcast_mut::<T>())
            .ok_or_else(|| {
                HandlerError::permanent_msg(format_args!(
                    "no open transaction of type `{}`: this handler runs only where the runtime provides one",
                    std::any::type_name::<T>()
                ))
            })
    }
}

/// A handler's event parameter, borrowed from the envelope the runtime holds (a domain event)
/// or built for the call (an event union, whose variant is cloned out of the envelope).
#[derive(Debug)]
pub enum EventRef<'a, T> {
    /// Borrowed from the envelope.
    Borrowed(&'a T),
    /// Built for this call.
    Owned(T),
}

impl<T> std::ops::Deref for EventRef<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        match self {
            EventRef::Borrowed(t) => t,
            EventRef::Owned(t) => t,
        }
    }
}

/// What a handler's event parameter holds: one [`DomainEvent`] (every domain event is one),
/// or an event union ([`derive@crate::EventUnion`], which implements it).
///
/// Not implemented by hand: the blanket impl covers domain events, the derive covers unions.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a domain event or an event union",
    label = "`{Self}` implements neither `DomainEvent` nor `EventUnion`",
    note = "add `#[derive(event_core::DomainEvent)]` and `#[event(name = \"context.action\", version = 1)]` to a struct, or `#[derive(event_core::EventUnion)]` to an enum of domain events"
)]
pub trait HandlerEvent: Sized + Send + Sync + 'static {
    /// The event types: one for a domain event, one per variant for a union.
    const EVENTS: &'static [fn() -> EventDescriptor];
    /// The parameter for the envelope in `context`, `None` when it holds none of
    /// [`EVENTS`](Self::EVENTS).
    fn event_from<'a>(context: &HandlerContext<'a>) -> Option<EventRef<'a, Self>>;
    /// The same as an envelope: the metadata with the event (or variant).
    fn envelope_from<'a>(context: &HandlerContext<'a>) -> Option<EventRef<'a, Envelope<Self>>>;
}

impl<E: DomainEvent> HandlerEvent for E {
    const EVENTS: &'static [fn() -> EventDescriptor] = &[EventDescriptor::of::<E>];
    #[inline(always)]
    fn event_from<'a>(context: &HandlerContext<'a>) -> Option<EventRef<'a, E>> {
        context
            .try_envelope::<E>()
            .map(|e| EventRef::Borrowed(e.event()))
    }
    #[inline(always)]
    fn envelope_from<'a>(context: &HandlerContext<'a>) -> Option<EventRef<'a, Envelope<E>>> {
        context.try_envelope::<E>().map(EventRef::Borrowed)
    }
}

/// An event union: an enum whose variants each hold one domain event, so that one handler
/// sees an aggregate's whole stream in sequence order. Implemented by
/// [`derive@crate::EventUnion`].
pub trait EventUnion: HandlerEvent {
    /// The wire name of the variant's event (`order.placed`).
    fn event_name(&self) -> &'static str;
}

/// The first parameter of a handler: `&E` or `&Envelope<E>`, where `E` is a domain event or an
/// event union.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a domain event",
    label = "the event parameter must be `&E` or `&Envelope<E>` where `E: DomainEvent` or `E: EventUnion`",
    note = "add `#[derive(event_core::DomainEvent)]` and `#[event(name = \"context.action\", version = 1)]` to the definition of `{Self}`, or `#[derive(event_core::EventUnion)]` to an enum of domain events"
)]
pub trait EventArg: Sized + Send + Sync + 'static {
    /// The event types the parameter takes.
    const EVENTS: &'static [fn() -> EventDescriptor];
    /// `true` for `Envelope<E>`.
    const IS_ENVELOPE: bool;
    /// The parameter for the envelope in `context`.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when the envelope is of another type (a runtime bug: the
    /// registry routes by type id).
    fn from_context<'a>(context: &HandlerContext<'a>) -> Result<EventRef<'a, Self>, HandlerError>;
}

fn wrong_event<T>() -> HandlerError {
    HandlerError::permanent_msg(format_args!(
        "handler context holds another event type than `{}`",
        std::any::type_name::<T>()
    ))
}

impl<E: HandlerEvent> EventArg for E {
    const EVENTS: &'static [fn() -> EventDescriptor] = E::EVENTS;
    const IS_ENVELOPE: bool = false;
    #[inline(always)]
    fn from_context<'a>(context: &HandlerContext<'a>) -> Result<EventRef<'a, E>, HandlerError> {
        E::event_from(context).ok_or_else(wrong_event::<E>)
    }
}

impl<E: HandlerEvent> EventArg for Envelope<E> {
    const EVENTS: &'static [fn() -> EventDescriptor] = E::EVENTS;
    const IS_ENVELOPE: bool = true;
    #[inline(always)]
    fn from_context<'a>(
        context: &HandlerContext<'a>,
    ) -> Result<EventRef<'a, Envelope<E>>, HandlerError> {
        E::envelope_from(context).ok_or_else(wrong_event::<E>)
    }
}

/// What a handler may return: `()` or `Result<(), E>` where `E: Into<HandlerError>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a valid return type for an event handler",
    label = "handlers return `()` or `Result<(), E>` where `E: Into<event_core::HandlerError>`",
    note = "any `std::error::Error + Send + Sync + 'static` converts; use `event_core::HandlerError` to mark an error permanent"
)]
pub trait IntoHandlerResult {
    /// Converts into the runtime's result.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl IntoHandlerResult for () {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl<E: Into<HandlerError>> IntoHandlerResult for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self.map_err(Into::into)
    }
}

/// A resource parameter type: `Send + Sync + 'static`, so that the runtime can share it
/// between workers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler resource",
    label = "resources are shared between workers: they must be `Send + Sync + 'static`",
    note = "wrap it in a type that is `Send + Sync` (a pool, an `Arc<Mutex<_>>`) and provide that to the dispatcher"
)]
pub trait Resource: Send + Sync + 'static {}
impl<T: Send + Sync + 'static> Resource for T {}

/// Implemented by the type `#[event_handler]` emits next to the function (a braced struct of
/// the function's name), to reach the handler's descriptor for explicit registration:
/// `builder.handler::<on_order_placed>()`.
pub trait Handler {
    /// The handler's descriptor.
    const DESCRIPTOR: &'static HandlerDescriptor;
}

#[cold]
#[inline(never)]
fn wrong_envelope<E>() -> HandlerError {
    HandlerError::permanent_msg(format_args!(
        "handler context holds another event type than `{}`",
        std::any::type_name::<E>()
    ))
}

#[cold]
#[inline(never)]
fn missing_resource<T>() -> HandlerError {
    HandlerError::permanent_msg(format_args!(
        "resource `{}` was not provided",
        std::any::type_name::<T>()
    ))
}
