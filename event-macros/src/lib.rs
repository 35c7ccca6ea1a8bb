//! Implementation detail of [`event-core`](https://docs.rs/event-core): `#[derive(DomainEvent)]`
//! and `#[event_handler]`. Depend on `event-core`, which re-exports both; the code they
//! generate names only `event_core::__private` paths.
//!
//! The examples below are marked `ignore` because this crate cannot depend on `event-core`;
//! the same examples are compiled and run in `event-core`'s documentation, and every error
//! shown is a UI test in the `event-tests` crate.
#![warn(missing_docs, unreachable_pub)]

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;

/// Implements `DomainEvent` for a struct and registers it with the runtime.
///
/// ```rust,ignore
/// use event_core::DomainEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 1)]
/// pub struct OrderPlaced {
///     #[event(aggregate_id)]
///     pub order_id: String,
///     pub customer_id: String,
/// }
///
/// assert_eq!(OrderPlaced::NAME, "order.placed");
/// assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
/// ```
///
/// # Keys
///
/// On the struct, `#[event(...)]` takes:
///
/// | key | value | default |
/// |---|---|---|
/// | `name` | the wire name, lower-case and dot-separated `context.action`: `"order.placed"`, `"billing.invoice_sent"` | required |
/// | `version` | the schema version of this shape, an integer from 1 | `1` |
/// | `aggregate` | the aggregate type, a lower-case identifier | the part of `name` before the first `.` |
/// | `crate` | the path to `event_core`, when it is re-exported under another name: `crate = my_app::events` | `::event_core` |
///
/// Exactly one field is marked `#[event(aggregate_id)]`: the id of the aggregate instance the
/// event belongs to (the CloudEvents `subject`). Its type must implement `Display`.
///
/// `version` defaults to 1 so that a new event needs only its name; write it out once the
/// event has a second version, next to the upcaster from the first.
///
/// The type must also implement serde's `Serialize` and `Deserialize`.
///
/// # Errors
///
/// Every mistake in the attribute is reported at once, at the offending token:
///
/// ```text
/// error: invalid event name "Order.Placed": each segment must start with a lower-case ASCII
///        letter; event names are lower-case, dot-separated `context.action`, like
///        "order.placed" or "billing.invoice_sent"
///  --> src/events.rs:4:16
///   |
/// 4 | #[event(name = "Order.Placed", version = 1)]
///   |                ^^^^^^^^^^^^^^
/// ```
///
/// Also rejected: a missing `name`, `version = 0`, a version that is not an integer literal,
/// unknown and duplicate keys, no or two `#[event(aggregate_id)]` fields, any key but
/// `aggregate_id` on a field, an `aggregate_id` field whose type is not `Display` (at the
/// type), enums, unions, tuple and unit structs, generics. A type without serde's traits is
/// reported at its name:
///
/// ```text
/// error[E0277]: domain event `OrderPlaced` must implement serde's `Serialize` and `Deserialize`
///  --> src/events.rs:5:12
///   |
/// 5 | pub struct OrderPlaced {
///   |            ^^^^^^^^^^^ missing `Serialize` or `Deserialize`
///   |
/// help: the trait `for<'de> Deserialize<'de>` is not implemented for `OrderPlaced`
///   = note: add `#[derive(serde::Serialize, serde::Deserialize)]` to `OrderPlaced`
/// ```
///
/// (one such error per missing trait). A mistake in the attribute leaves an unregistered
/// implementation behind, so that code using the type reports nothing more.
///
/// # Limitations
///
/// Events are non-generic structs with named fields: a wire name and version identify one
/// concrete Rust type. Model a family of events as several structs, not as an enum.
#[proc_macro_derive(DomainEvent, attributes(event))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive_domain_event(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Declares a function as an event handler and registers it with the runtime.
///
/// ```rust,ignore
/// use event_core::{event_handler, Envelope, HandlerError};
/// # use event_core::DomainEvent;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, DomainEvent)]
/// # #[event(name = "order.placed")]
/// # pub struct OrderPlaced { #[event(aggregate_id)] pub order_id: String }
/// # pub struct Mailer; impl Mailer { async fn send(&self, _: &str) -> Result<(), std::io::Error> { Ok(()) } }
///
/// /// Sends the confirmation mail once the order is committed.
/// #[event_handler(priority = 10, name = "mail.order_confirmation")]
/// async fn send_confirmation(event: &Envelope<OrderPlaced>, mailer: &Mailer) -> Result<(), HandlerError> {
///     // The event id is the idempotency key for the mail provider.
///     mailer.send(&event.id().to_string()).await?;
///     Ok(())
/// }
/// ```
///
/// The function is kept as written, so unit tests call it directly. Next to it the macro
/// emits a hidden type of the same name implementing `event_core::Handler` (for explicit
/// registration, `builder.handler::<send_confirmation>()`), and submits the handler's
/// descriptor to `inventory`.
///
/// # Parameters
///
/// 1. The event: `&E` where `E: DomainEvent`, or `&Envelope<E>` for the metadata (id,
///    sequence, correlation). Detection is trait-based (`EventArg`), so a type alias of
///    `Envelope<E>` works too.
/// 2. Any number of resources, `&T` with `T: Send + Sync + 'static`, looked up by type from
///    what the runtime was given.
/// 3. At most one `&mut T` anywhere after the event: the open transaction or connection the
///    runtime provides (`T: Send + 'static`).
///
/// The function returns `()`, or `Result<(), E>` where `E` converts into
/// `event_core::HandlerError` (any `std::error::Error + Send + Sync + 'static` does, as a
/// transient error). It may be `async`.
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `priority = 10` | order among the handlers of one event, lower first; may be negative | `0` |
/// | `name = "…"` | the stable handler name, first half of the idempotency key: pin it so that moving the function does not reset deduplication | module path and function name |
/// | `in_transaction` | run inside the unit of work's open transaction, before COMMIT; an error aborts the commit | after commit, through durable delivery |
/// | `unordered` | deliveries of this handler are not held back by earlier events of the same aggregate (for handlers whose effects commute: an export, a counter); a dead letter then blocks nothing | per aggregate, in sequence order: event *n* waits until *n − 1* completed |
/// | `crate = path` | the path to `event_core` when it is re-exported | `::event_core` |
///
/// # Errors
///
/// Signature and option mistakes are reported at once, at the offending token. An event
/// parameter that is not a domain event gets one error, at the parameter:
///
/// ```text
/// error[E0277]: `String` is not a domain event
///  --> src/billing.rs:7:22
///   |
/// 7 | fn on_placed(event: &String) {}
///   |                      ^^^^^^ the event parameter must be `&E` or `&Envelope<E>` where `E: DomainEvent`
///   |
///   = help: the trait `DomainEvent` is not implemented for `String`
///   = note: add `#[derive(event_core::DomainEvent)]` and `#[event(name = "context.action", version = 1)]` to the definition of `String`
/// ```
///
/// A resource that is not `Send + Sync`, a transaction that is not `Send`, and a return
/// type that does not convert are reported the same way, once, under the type. A future
/// that is not `Send` is reported at the handler's `async`.
///
/// Also rejected, each with its own message: no parameter, the event by value or by `&mut`,
/// a resource by value, a second `&mut` parameter, a `self` receiver, generic parameters
/// (including `impl Trait`) and `where` clauses, `unsafe fn`, unknown and duplicate options,
/// a value on `in_transaction`, a `priority` that is not an `i32` literal, an empty `name`,
/// and the attribute on anything but a function.
///
/// # Limitations
///
/// Handlers are free functions: not methods or associated functions in an `impl` block (the
/// runtime has no `self` to call them on; take what the handler needs as resources instead),
/// and not generic (the runtime needs one concrete function per event type).
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, input: TokenStream) -> TokenStream {
    expand::event_handler(args.into(), input.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
