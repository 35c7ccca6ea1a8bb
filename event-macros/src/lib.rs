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
mod union;

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
/// | `upcast_from` | the type of the previous version of this event, `upcast_from = OrderPlacedV1`: envelopes of that version are converted into this one with `From` before a handler of this one runs | none: the first version |
/// | `deny_unknown_fields` | (no value) a payload field this type does not declare is a decode error naming the field, instead of being ignored | unknown fields are ignored |
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
/// # Versions
///
/// Each version of an event is its own type. The newer one names the previous one with
/// `upcast_from`, and converts it with a plain `From` impl; the previous type must be `Clone`
/// (the runtime converts a clone, keeping the original envelope as it is):
///
/// ```rust,ignore
/// #[derive(Clone, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 1)]
/// pub struct OrderPlacedV1 {
///     #[event(aggregate_id)]
///     pub order_id: String,
///     pub country: String,
/// }
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
/// pub struct OrderPlaced {
///     #[event(aggregate_id)]
///     pub order_id: String,
///     pub country: String,
///     pub currency: String,
/// }
///
/// impl From<OrderPlacedV1> for OrderPlaced {
///     fn from(v1: OrderPlacedV1) -> Self {
///         let currency = if v1.country == "Canada" { "CAD" } else { "USD" };
///         OrderPlaced { order_id: v1.order_id, country: v1.country, currency: currency.into() }
///     }
/// }
/// ```
///
/// Handlers take the newest version; older envelopes are upcast step by step (v1 → v2 → v3).
/// The previous version is registered with the newer one. At start-up the runtime refuses a
/// gap in a chain, two upcasts from one version, and a handler of an older version than the
/// newest registered (see `event_core::Upcaster`).
///
/// # Sensitive fields
///
/// `#[event(sensitive)]` on a field marks a personal or secret value (an e-mail, a card
/// number). The runtime masks it as `"***"` wherever it prints an envelope (`events dlq show
/// --payload`), the schema catalog marks its property `"x-sensitive": true`, and each outbox
/// records it in the database's `event_catalog` table so that the standalone `events` tool,
/// which knows no types, masks it too. Its names are serde's (`#[serde(rename = "…")]`, the
/// struct's `rename_all`, and every `alias`, since a producer may write one); refused: a
/// `rename(serialize = …, deserialize = …)` pair, a `flatten`ed or skipped field, and the
/// aggregate id (it is the envelope's `subject`, in every log line). It changes nothing
/// on the wire: the payload still carries the value; whoever reads the store reads it.
///
/// ```rust,ignore
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "customer.registered")]
/// pub struct CustomerRegistered {
///     #[event(aggregate_id)]
///     pub customer_id: String,
///     #[event(sensitive)]
///     pub email: String,
/// }
/// ```
///
/// # Unknown fields
///
/// By default a payload field the type does not declare is ignored, so that a consumer keeps
/// working when a newer producer adds one. `deny_unknown_fields` makes it a decode error
/// (`DecodeError::UnknownField`, naming the field by its path, `card.brand`, and the event) at
/// every level of the payload, nested structs included — unlike serde's own
/// `#[serde(deny_unknown_fields)]`, which must be repeated on each struct. Keys left over by a
/// `#[serde(flatten)]` field are not seen (serde drops them without reporting them).
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
/// `aggregate_id` and `sensitive` on a field, a `sensitive` aggregate id, an `aggregate_id` field whose type is not `Display` (at the
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
/// `upcast_from` is checked at its value. A type that is not a domain event:
///
/// ```text
/// error[E0277]: `OrderPlacedV1` is not a domain event
///   --> src/events.rs:11:59
///    |
/// 11 | #[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
///    |                                                           ^^^^^^^^^^^^^ `OrderPlacedV1` does not implement `DomainEvent`
///    |
///    = note: add `#[derive(event_core::DomainEvent)]` and `#[event(name = "context.action", version = 1)]` to the definition of `OrderPlacedV1`
/// ```
///
/// Another event, or a version that is not lower (evaluated at compile time):
///
/// ```text
/// error[E0080]: evaluation panicked: `upcast_from = OrderShipped` names another event: an
///               upcaster converts an older version of the same event, so `OrderShipped` must
///               have `name = "order.placed"` like `OrderPlacedV2`
///   --> src/events.rs:12:59
///    |
/// 12 | #[event(name = "order.placed", version = 2, upcast_from = OrderShipped)]
///    |                                                           ^^^^^^^^^^^^ evaluation of `_::__UPCAST` failed inside this call
/// ```
///
/// ```text
/// error[E0080]: evaluation panicked: `upcast_from = OrderPlacedV3` is not an older version:
///               an upcaster converts an older version into a newer one, so the version of
///               `OrderPlacedV3` must be lower than 2, the version of `OrderPlacedV2`
/// ```
///
/// A missing conversion, or a previous version that is not `Clone`:
///
/// ```text
/// error[E0277]: missing upcaster: `OrderPlacedV2` cannot be built from `OrderPlacedV1`
///   --> src/events.rs:13:59
///    |
/// 13 | #[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
///    |                                                           ^^^^^^^^^^^^^ `upcast_from` needs `impl From<OrderPlacedV1> for OrderPlacedV2`
/// ```
///
/// ```text
/// error[E0277]: `OrderPlacedV1` must implement `Clone` to be upcast from
/// ```
///
/// Also rejected at the attribute: `upcast_from` on version 1, a value that is not a type
/// path (a string, say), and a value on `deny_unknown_fields`.
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

/// Makes an enum whose variants each hold one domain event an event union: a handler of
/// `&OrderEvent` receives every variant, ordered per aggregate across the union's event types.
///
/// ```rust,ignore
/// use event_core::{event_handler, DomainEvent, EventUnion};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed")]
/// pub struct OrderPlaced { #[event(aggregate_id)] pub order_id: String }
///
/// #[derive(Clone, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.shipped")]
/// pub struct OrderShipped { #[event(aggregate_id)] pub order_id: String }
///
/// #[derive(EventUnion)]
/// pub enum OrderEvent {
///     Placed(OrderPlaced),
///     Shipped(OrderShipped),
/// }
///
/// #[event_handler]
/// fn order_summary(event: &OrderEvent) {
///     match event {
///         OrderEvent::Placed(e) => println!("placed {}", e.order_id),
///         OrderEvent::Shipped(e) => println!("shipped {}", e.order_id),
///     }
/// }
/// ```
///
/// The union is not an event: it has no name or version of its own and is never recorded or
/// stored; its variants are. A handler of the union is one handler (one name, one idempotency
/// key per event, one destination), routed from each variant's event type through the same
/// table as any handler. Durable delivery orders its deliveries per aggregate by the
/// aggregate sequence across all the variants, so `order.shipped` never overtakes
/// `order.placed`; an event that cannot be delivered (undecodable, dead-lettered) holds back
/// the later events of that aggregate for that handler. Older versions of a variant's event
/// are upcast to it, as for any handler.
///
/// The handler gets the union built around a clone of the event (the envelope keeps the
/// original for the other handlers): variants must be `Clone`. `&Envelope<OrderEvent>` gives
/// the metadata too.
///
/// # Keys
///
/// `#[event(crate = path)]`, when `event_core` is re-exported under another name; nothing else.
///
/// # Errors
///
/// Reported at the offending variant: a unit variant, a struct variant, a tuple variant of
/// several fields, a type held by two variants; a type that is not a domain event, or is not
/// `Clone`:
///
/// ```text
/// error[E0277]: `OrderShipped` must implement `Clone` to be held by an event union
///  --> src/events.rs:14:13
///   |
/// 14 |     Shipped(OrderShipped),
///   |             ^^^^^^^^^^^^ a variant of an event union must be `Clone`
/// ```
///
/// Also rejected: structs and unions, an empty enum, generics, any key but `crate`; and, at
/// the enum's name, when evaluated at compile time, variants of different aggregate types
/// (a union is the stream of one aggregate) or the same event twice (two versions of it).
///
/// # Limitations
///
/// Only handlers take a union: record and commit the variants' events themselves.
#[proc_macro_derive(EventUnion, attributes(event))]
pub fn derive_event_union(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    union::derive_event_union(&input)
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
///    `Envelope<E>` works too. `E` may be an event union (`#[derive(EventUnion)]`): the
///    handler then receives every variant, in sequence order per aggregate.
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
/// type that does not convert are reported the same way, once, under the type; for
/// `Result<(), E>`, under `E`:
///
/// ```text
/// error[E0277]: `String` cannot be the error type of an event handler
///   --> src/billing.rs:15:49
///    |
/// 15 | fn on_placed(event: &OrderPlaced) -> Result<(), String> {
///    |                                                 ^^^^^^ a handler returns `Result<(), E>` where `E` converts into `event_core::HandlerError`
/// ```
///
/// A future that is not `Send` is reported at the handler's `async`. The transaction
/// written before the event is reported as that:
///
/// ```text
/// error: the event must be the first parameter of a handler: `&mut Tx` here is taken for the
///        event; the open transaction goes after it, `fn on_placed(event: &OrderPlaced, tx: &mut Tx, …)`
/// ```
///
/// A body that does not parse yet (half-typed code) leaves the function as written and the
/// handler registered from its signature: rustc reports the syntax error, once, and callers
/// of the function see nothing more.
///
/// A second event type among the parameters is not taken for a resource:
///
/// ```text
/// error[E0277]: a handler takes one event, and `OrderPaid` is a second one
///  --> src/billing.rs:9:51
///   |
/// 9 | fn on_order(placed: &OrderPlaced, db: &Db, paid: &OrderPaid) {
///   |                                                   ^^^^^^^^^ the first parameter is the event; `&OrderPaid` here would be looked up as a resource
///   |
///   = note: to handle several event types in one handler, hold them in an enum with `#[derive(event_core::EventUnion)]` and take `&ThatEnum`; or write one handler per event type
/// ```
///
/// The attribute on a function in an `impl` block is reported at the function: with a `self`
/// receiver, or naming `Self`, as one error. An associated function that does neither looks
/// like a free function to the macro, and gets two: rustc's "struct is not supported in
/// `trait`s or `impl`s" at the attribute (the handler's marker type cannot go there), then
///
/// ```text
/// error[E0277]: `#[event_handler]` goes on a free function, not on a function in an `impl` block
///   --> src/billing.rs:19:8
///    |
/// 19 |     fn on_placed(event: &OrderPlaced, db: &Db) {
///    |        ^^^^^^^^^ this handler is an associated function
///    |
///    = note: the runtime calls a handler with no value or type to call it on: move the function out of the `impl` block, or keep it there and call it from a free `#[event_handler]` function
/// ```
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
/// runtime has no `self` to call them on; take what the handler needs as resources instead,
/// or call the method from a free handler), and not generic (the runtime needs one concrete
/// function per event type). A handler takes one event: several event types go through an
/// event union. A type that is an event (or an `Envelope`) cannot be a resource.
#[proc_macro_attribute]
pub fn event_handler(args: TokenStream, input: TokenStream) -> TokenStream {
    expand::event_handler(args.into(), input.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
