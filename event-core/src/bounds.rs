//! The traits the code of `#[event_handler]` checks a handler's parameters against, shaped so
//! that rustc's error names only public-looking traits. Not public API; must not hold logic.
//!
//! Two rules make the errors read well. The generated code reaches each bound through a trait
//! item path (`<T as ResourceArg>::get`), so rustc states only `T: ResourceArg` and adds no
//! "required by a bound in `event_core::__private::…`" note with a snippet of this crate; and
//! the traits have no supertraits, so that a missing `Sync` is reported through
//! [`ResourceArg`]'s message rather than `Sync`'s own. They are re-exported `#[doc(hidden)]` at
//! the crate root as well as in `__private`, which makes rustc print them by their name
//! (`ResourceArg`) instead of their `__private` path.

use core::marker::PhantomData;

use crate::error::HandlerError;
use crate::handler::{EventArg, HandlerContext, Resource};

/// A `&T` resource parameter of a handler: [`Resource`], as the generated code reaches it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler resource",
    label = "resources are shared between workers: they must be `Send + Sync + 'static`",
    note = "wrap it in a type that is `Send + Sync` (a pool, an `Arc<Mutex<_>>`) and provide that to the dispatcher"
)]
pub trait ResourceArg {
    /// Borrows the resource at `index` (parameter order) from the context.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when it is missing (the registry checks this at start-up).
    fn get<'b>(ctx: &HandlerContext<'b>, index: usize) -> Result<&'b Self, HandlerError>;
}

impl<T: Resource> ResourceArg for T {
    #[inline(always)]
    fn get<'b>(ctx: &HandlerContext<'b>, index: usize) -> Result<&'b T, HandlerError> {
        ctx.resource::<T>(index)
    }
}

/// The type of a handler's `&mut T` parameter: the open transaction or connection.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the transaction parameter of an event handler",
    label = "the runtime may hand the open transaction to another thread: it must be `Send + 'static`",
    note = "take the transaction or connection type the runtime provides, such as a database transaction"
)]
pub trait TransactionArg {
    /// Takes the transaction from the context.
    ///
    /// # Errors
    /// A permanent [`HandlerError`] when there is no open transaction of this type.
    fn take<'b>(ctx: &mut HandlerContext<'b>) -> Result<&'b mut Self, HandlerError>;
}

impl<T: Send + 'static> TransactionArg for T {
    #[inline(always)]
    fn take<'b>(ctx: &mut HandlerContext<'b>) -> Result<&'b mut T, HandlerError> {
        ctx.take_transaction::<T>()
    }
}

// The return type `Result<(), E>`, in two steps, so that a wrong error type is reported at
// the error type: `ReturnArg` takes any `Result<(), E>`; `ErrorArg` is the bound on `E`.
// Checked as one `Result<(), E>: IntoHandlerResult`, a failing `E: Error` bound is a leaf of
// another type, and rustc prints it raw ("the trait bound `String: StdError` is not
// satisfied", pointing into this crate); as `E: ErrorArg`, the leaf has the root's type and
// rustc prints `ErrorArg`'s message. (Any other return type is checked as
// `IntoHandlerResult`, whose message covers it.)

#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a valid return type for an event handler",
    label = "handlers return `()` or `Result<(), E>` where `E: Into<event_core::HandlerError>`",
    note = "any `std::error::Error + Send + Sync + 'static` converts; use `event_core::HandlerError` to mark an error permanent"
)]
/// A handler's `Result<(), E>`, whatever `E`.
pub trait ReturnArg {
    /// `E`.
    type Error;
    /// The returned value.
    fn split(self) -> Result<(), Self::Error>;
}

impl<E> ReturnArg for Result<(), E> {
    type Error = E;
    #[inline(always)]
    fn split(self) -> Result<(), E> {
        self
    }
}

#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error type of an event handler",
    label = "a handler returns `Result<(), E>` where `E` converts into `event_core::HandlerError`",
    note = "any `std::error::Error + Send + Sync + 'static` converts (a type with `#[derive(thiserror::Error)]`, `std::io::Error`); for a message, return `Result<(), event_core::HandlerError>` and build it with `HandlerError::transient_msg(…)` or `HandlerError::permanent_msg(…)`"
)]
/// The error type of a handler's `Result<(), E>`: converts into [`HandlerError`].
pub trait ErrorArg {
    /// Converts.
    fn into_handler_error(self) -> HandlerError;
}

impl<E: Into<HandlerError>> ErrorArg for E {
    #[inline(always)]
    fn into_handler_error(self) -> HandlerError {
        self.into()
    }
}

// A second event among the resources. `fn h(placed: &OrderPlaced, paid: &OrderPaid)` would
// otherwise compile, take `OrderPaid` as a resource, and fail at start-up with "resource not
// provided". Autoref specialisation tells the two apart on a concrete type:
// `(&EventProbe::<T>::NEW).event_kind()` is `SecondEvent` when `T: EventArg` (the by-value
// method wins) and `NotAnEvent` otherwise; only `NotAnEvent` implements `OneEvent<T>`.

/// The probe of a resource parameter's type.
pub struct EventProbe<T: ?Sized>(PhantomData<T>);

impl<T: ?Sized> EventProbe<T> {
    /// The probe.
    pub const NEW: Self = EventProbe(PhantomData);
}

/// What the probe found: the resource type is an event (or an envelope, or an event union).
pub struct SecondEvent;

/// What the probe found: the resource type is not an event.
pub struct NotAnEvent;

/// The method found when the resource type is an event.
pub trait ProbeEvent {
    /// `SecondEvent`.
    fn event_kind(&self) -> SecondEvent {
        SecondEvent
    }
}
impl<T: EventArg> ProbeEvent for EventProbe<T> {}

/// The fallback, through one more reference.
pub trait ProbeNotEvent {
    /// `NotAnEvent`.
    fn event_kind(&self) -> NotAnEvent {
        NotAnEvent
    }
}
impl<T: ?Sized> ProbeNotEvent for &EventProbe<T> {}

/// Holds when a resource parameter of type `T` is not an event.
#[diagnostic::on_unimplemented(
    message = "a handler takes one event, and `{T}` is a second one",
    label = "the first parameter is the event; `&{T}` here would be looked up as a resource",
    note = "to handle several event types in one handler, hold them in an enum with `#[derive(event_core::EventUnion)]` and take `&ThatEnum`; or write one handler per event type"
)]
pub trait OneEvent<T: ?Sized> {
    /// Nothing: the call states the bound.
    fn check(&self) {}
}
impl<T: ?Sized> OneEvent<T> for NotAnEvent {}

/// Implemented only by the constant the code of `#[event_handler]` defines next to a free
/// function. Next to a function in an `impl` block, that constant is an associated item and not
/// in scope, so the pattern that names it binds a fresh `i32` instead (the literal's fallback),
/// and this bound fails with the message below.
#[diagnostic::on_unimplemented(
    message = "`#[event_handler]` goes on a free function, not on a function in an `impl` block",
    label = "this handler is an associated function",
    note = "the runtime calls a handler with no value or type to call it on: move the function out of the `impl` block, or keep it there and call it from a free `#[event_handler]` function"
)]
pub trait FreeFunction {
    /// Nothing: the call states the bound.
    fn free_function(&self) {}
}
// Two integer types, so that the literal's type is not inferred from a single impl.
#[diagnostic::do_not_recommend]
impl FreeFunction for u8 {}
#[diagnostic::do_not_recommend]
impl FreeFunction for u16 {}
