//! Typed domain events for Rust: the vocabulary a domain crate depends on.
//!
//! ```
//! use event_core::{event_handler, DomainEvent, Envelope};
//! use serde::{Deserialize, Serialize};
//!
//! /// An order was placed.
//! #[derive(Debug, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.placed", version = 1)]
//! pub struct OrderPlaced {
//!     #[event(aggregate_id)]
//!     pub order_id: String,
//!     pub customer_id: String,
//! }
//!
//! /// Sends a confirmation; registered at compile time, run by `event-runtime`.
//! #[event_handler(priority = 10)]
//! fn send_confirmation(event: &OrderPlaced) {
//!     println!("order {} placed by {}", event.order_id, event.customer_id);
//! }
//!
//! let envelope = Envelope::new(OrderPlaced {
//!     order_id: "US-2019-103800".into(),
//!     customer_id: "DP-13000".into(),
//! });
//! assert_eq!(envelope.aggregate_id(), "US-2019-103800");
//! ```
//!
//! This crate has no I/O and no async runtime: domain crates depend on it alone.
//! `event-runtime` collects every event and handler declared with the macros (through
//! `inventory`) into a dispatcher, and carries events through the outbox.
//!
//! | concept | here |
//! |---|---|
//! | event | [`DomainEvent`], [`derive@DomainEvent`] |
//! | envelope | [`Envelope`], [`RawEnvelope`] (CloudEvents 1.0 JSON), [`Metadata`] |
//! | handler | [`macro@event_handler`], [`HandlerDescriptor`], [`HandlerError`] |
//! | aggregate | [`EventRecorder`] |
#![warn(missing_docs, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod envelope;
mod error;
mod event;
mod handler;
mod recorder;

pub use envelope::{AnyEnvelope, Envelope, Headers, Metadata, RawEnvelope, DEFAULT_SOURCE};
pub use error::{DecodeError, ErrorKind, HandlerError, HeaderError};
pub use event::{check_event_name, DomainEvent, EventDescriptor};
pub use handler::{
    DeliveryMode, EventArg, Handler, HandlerCall, HandlerContext, HandlerDescriptor,
    HandlerFuture, IntoHandlerResult, Resource, ResourceDescriptor,
};
pub use recorder::EventRecorder;

#[doc(inline)]
pub use event_macros::{event_handler, DomainEvent};

/// An event type submitted to `inventory` by `#[derive(DomainEvent)]`.
#[derive(Debug)]
pub struct EventRegistration {
    /// Builds the descriptor.
    pub describe: fn() -> EventDescriptor,
}

/// A handler submitted to `inventory` by `#[event_handler]`.
#[derive(Debug)]
pub struct HandlerRegistration {
    /// The handler's descriptor.
    pub descriptor: &'static HandlerDescriptor,
}

inventory::collect!(EventRegistration);
inventory::collect!(HandlerRegistration);

/// Every event type registered through `inventory` in the linked program.
pub fn registered_events() -> impl Iterator<Item = EventDescriptor> {
    inventory::iter::<EventRegistration>().map(|r| (r.describe)())
}

/// Every handler registered through `inventory` in the linked program.
pub fn registered_handlers() -> impl Iterator<Item = &'static HandlerDescriptor> {
    inventory::iter::<HandlerRegistration>().map(|r| r.descriptor)
}

// Not public API: paths used by the code the macros generate.
#[doc(hidden)]
pub mod __private {
    pub use inventory;
    pub use serde;
    pub use serde_json;

    pub use crate::{
        DeliveryMode, DomainEvent, Envelope, EventArg, EventDescriptor, EventRegistration,
        Handler, HandlerCall, HandlerContext, HandlerDescriptor, HandlerError, HandlerFuture,
        HandlerRegistration, IntoHandlerResult, Resource, ResourceDescriptor,
    };

    pub use core::option::Option::{None, Some};
    pub use core::result::Result::{Err, Ok};
    pub use std::boxed::Box;

    /// serde's traits, with an error that says the event needs them.
    #[diagnostic::on_unimplemented(
        message = "domain event `{Self}` must implement serde's `Serialize` and `Deserialize`",
        label = "missing `Serialize` or `Deserialize`",
        note = "add `#[derive(serde::Serialize, serde::Deserialize)]` to `{Self}`"
    )]
    pub trait SerdeEvent: serde::Serialize + serde::de::DeserializeOwned {}
    impl<T: serde::Serialize + serde::de::DeserializeOwned> SerdeEvent for T {}

    /// Called by the derive so that a missing serde impl is reported once, at the derive.
    pub const fn assert_serde<T: ?Sized + SerdeEvent>() {}
    /// Called by `#[event_handler]` per parameter so that errors point at the parameter.
    pub const fn assert_event_arg<T: ?Sized + EventArg>() {}
    /// Called by `#[event_handler]` per resource parameter.
    pub const fn assert_resource<T: ?Sized + Resource>() {}
    /// Called by `#[event_handler]` for the return type.
    pub fn assert_handler_result<T: IntoHandlerResult>() {}
}
