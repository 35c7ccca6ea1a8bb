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
//! | event union (one handler for an aggregate's whole stream) | [`derive@EventUnion`], [`EventUnion`] |
//! | aggregate | [`EventRecorder`] |
//! | upcaster, schema version | [`Upcaster`], `#[event(version = 2, upcast_from = OrderPlacedV1)]` |
//!
//! # Event unions
//!
//! An enum whose variants each hold one event, with `#[derive(EventUnion)]`, is what a handler
//! takes to see every event of an aggregate in sequence order (one handler, so one delivery
//! order per aggregate across all the variants):
//!
//! ```
//! use event_core::{event_handler, DomainEvent, EventUnion};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.placed")]
//! pub struct OrderPlaced { #[event(aggregate_id)] pub order_id: String }
//!
//! #[derive(Clone, Serialize, Deserialize, DomainEvent)]
//! #[event(name = "order.shipped")]
//! pub struct OrderShipped { #[event(aggregate_id)] pub order_id: String }
//!
//! #[derive(EventUnion)]
//! pub enum OrderEvent {
//!     Placed(OrderPlaced),
//!     Shipped(OrderShipped),
//! }
//!
//! #[event_handler]
//! fn order_summary(event: &OrderEvent) {
//!     match event {
//!         OrderEvent::Placed(e) => println!("placed {}", e.order_id),
//!         OrderEvent::Shipped(e) => println!("shipped {}", e.order_id),
//!     }
//! }
//!
//! let shipped = OrderEvent::Shipped(OrderShipped { order_id: "A-1".into() });
//! assert_eq!(shipped.event_name(), "order.shipped");
//! ```
//!
//! # Versions and upcasting
//!
//! An event is identified on the wire by (name, version); each version is its own Rust type,
//! and a newer one declares an upcast from the previous one with `upcast_from` and a `From`
//! impl. A handler takes the newest version; envelopes of older versions are upcast to it step
//! by step, never the other way. The rules, and why the older type must be `Clone`, are on
//! [`Upcaster`].
//!
//! # Decoding policy
//!
//! What decoding a payload ([`Envelope::decode`], and through it the runtime's registry) does
//! with a payload that does not match the type exactly:
//!
//! | the payload | decodes? |
//! |---|---|
//! | has a field the type does not declare (a newer producer added it) | yes, the field is ignored — forward compatibility. With `#[event(deny_unknown_fields)]`: no, [`DecodeError::UnknownField`] names the field (as a path, `card.brand`) and the event |
//! | lacks a field that has `#[serde(default)]` (an older producer did not send it) | yes, with the default |
//! | lacks a required field, or has one of the wrong type | no, [`DecodeError::Payload`] names the field, as serde reports it (``missing field `currency` ``) |
//! | is an older version of a registered event | yes, as that version; the runtime upcasts it to the version a handler takes |
//! | is a version newer than any registered, or of an unknown name | no, [`DecodeError::UnknownVersion`] / [`DecodeError::UnknownName`] |
//!
//! An envelope that does not decode is never a crash and never silently dropped: in-process
//! dispatch returns the [`DecodeError`], and durable delivery moves the delivery to the dead
//! letter queue with the reason (`unknown_event` for an unknown name or version, `undecodable`
//! otherwise) and the original envelope byte for byte, to be replayed once code that can
//! decode it is deployed.
//!
//! Integers are exact up to `u64::MAX`, `i64::MIN` and (`u128`/`i128`) beyond, in the
//! envelope and in the stores; see [`RawEnvelope`] for how a JavaScript consumer must read
//! them.
#![warn(missing_docs, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod bounds;
mod envelope;
mod error;
mod event;
mod handler;
mod json_error;
mod recorder;
mod union;
mod upcast;

pub use envelope::{
    AnyEnvelope, Envelope, Headers, Metadata, RawEnvelope, DEFAULT_SOURCE,
    PREVIOUS_SEQUENCE_ATTRIBUTE, TRACE_PARENT_ATTRIBUTE, TRACE_STATE_ATTRIBUTE,
};
pub use error::{DecodeError, ErrorChain, ErrorChainIter, ErrorKind, HandlerError, HeaderError};
pub use event::{check_event_name, DomainEvent, EventDescriptor};
pub use handler::{
    BoundResource, DeliveryMode, EnvelopeRef, EventArg, EventRef, EventUnion, Handler, HandlerCall,
    HandlerContext, HandlerDescriptor, HandlerEvent, HandlerFuture, IntoHandlerResult, Resource,
    ResourceDescriptor,
};
pub use json_error::JsonError;
pub use recorder::EventRecorder;
pub use upcast::Upcaster;

#[doc(inline)]
pub use event_macros::{event_handler, DomainEvent, EventUnion};

// Not public API either: re-exported here only so that rustc names these items by their name
// in an error's notes (`ResourceArg`, "required by a bound in `upcaster`"), not by their
// `__private` path, which it prints for an item reachable only through a hidden module.
// Generated code names `__private`.
#[doc(hidden)]
pub use __private::{upcaster, SerdeCheck, SerdeEvent, UpcastFrom, UpcastSource};
#[doc(hidden)]
pub use bounds::{
    ErrorArg, FreeFunction, OneEvent, ResourceArg, ReturnArg, SecondEvent, TransactionArg,
};
#[doc(hidden)]
pub use union::{check_union, UnionVariantClone};

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
    pub use schemars;
    pub use serde;
    pub use serde_json;

    /// Autoref specialisation: `(&SchemaProbe::<T>::NEW).json_schema()` is the schema of `T`
    /// when `T: JsonSchema` (the by-value method wins), `None` otherwise (the by-reference
    /// fallback). Lets the derive fill in the schema without requiring `JsonSchema`.
    pub struct SchemaProbe<T: ?Sized>(core::marker::PhantomData<T>);
    impl<T: ?Sized> SchemaProbe<T> {
        /// The probe.
        pub const NEW: Self = SchemaProbe(core::marker::PhantomData);
    }
    /// The schema of a `JsonSchema` type.
    pub trait SchemaOf {
        /// `Some(schema)`.
        fn json_schema(&self) -> Option<serde_json::Value>;
    }
    impl<T: ?Sized + schemars::JsonSchema> SchemaOf for SchemaProbe<T> {
        fn json_schema(&self) -> Option<serde_json::Value> {
            Some(
                schemars::SchemaGenerator::default()
                    .into_root_schema_for::<T>()
                    .to_value(),
            )
        }
    }
    /// The fallback for types without a schema.
    pub trait NoSchema {
        /// `None`.
        fn json_schema(&self) -> Option<serde_json::Value> {
            None
        }
    }
    impl<T: ?Sized> NoSchema for &SchemaProbe<T> {}

    pub use crate::{
        DeliveryMode, DomainEvent, Envelope, EventArg, EventDescriptor, EventRef,
        EventRegistration, EventUnion, Handler, HandlerCall, HandlerContext, HandlerDescriptor,
        HandlerError, HandlerEvent, HandlerFuture, HandlerRegistration, IntoHandlerResult,
        Resource, ResourceDescriptor, Upcaster,
    };
    pub use core::fmt::Display;

    pub use crate::union::{check_union, UnionVariant, UnionVariantClone, Variant};

    pub use crate::bounds::{
        ErrorArg, EventProbe, FreeFunction, NotAnEvent, OneEvent, ProbeEvent, ProbeNotEvent,
        ResourceArg, ReturnArg, SecondEvent, TransactionArg,
    };

    pub use core::option::Option::{self, None, Some};
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

    /// `SerdeEvent` without supertraits, for the derive's check at the type's name: it fails
    /// as itself, with this message (see `bounds`).
    #[diagnostic::on_unimplemented(
        message = "domain event `{Self}` must implement serde's `Serialize` and `Deserialize`",
        label = "missing `Serialize` or `Deserialize`",
        note = "add `#[derive(serde::Serialize, serde::Deserialize)]` to `{Self}`"
    )]
    pub trait SerdeCheck {
        /// Nothing: the path states the bound.
        const SERDE: () = ();
    }
    impl<T: serde::Serialize + serde::de::DeserializeOwned> SerdeCheck for T {}

    /// The event's descriptor function, for its registration. `#[derive(DomainEvent)]` calls it
    /// at the type's name, after stating `SerdeCheck` through a trait item path at the same
    /// span: a missing serde impl is reported there with its message and no note into this
    /// function, this call's same bound is dropped as a duplicate, and the `DomainEvent`
    /// bound, which fails for the same reason, adds no error.
    pub const fn describe_event<T: SerdeCheck + DomainEvent>() -> fn() -> EventDescriptor {
        EventDescriptor::of::<T>
    }

    /// `Clone`, with an error that says why an upcast source needs it.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` must implement `Clone` to be upcast from",
        label = "`upcast_from` names a type that is not `Clone`",
        note = "add `#[derive(Clone)]` to `{Self}`: the upcaster converts a clone of the older event, because the original envelope is kept as it is"
    )]
    // No supertraits on these two, so that they fail as themselves, with their message,
    // rather than as `Clone` or `From` (see `bounds`); their methods stand in for those.
    pub trait UpcastSource {
        /// A clone of the older event, to convert.
        fn clone_event(&self) -> Self
        where
            Self: Sized;
    }
    impl<T: Clone> UpcastSource for T {
        #[inline(always)]
        fn clone_event(&self) -> T {
            self.clone()
        }
    }

    /// `From<F>`, with an error that says the upcaster is missing.
    #[diagnostic::on_unimplemented(
        message = "missing upcaster: `{Self}` cannot be built from `{F}`",
        label = "`upcast_from` needs `impl From<{F}> for {Self}`",
        note = "write `impl From<{F}> for {Self}`: it converts an event of the older version into this one"
    )]
    pub trait UpcastFrom<F> {
        /// `From::from`.
        fn upcast(older: F) -> Self
        where
            Self: Sized;
    }
    impl<F, T: From<F>> UpcastFrom<F> for T {
        #[inline(always)]
        fn upcast(older: F) -> T {
            T::from(older)
        }
    }

    /// The upcaster `#[event(upcast_from = F)]` declares on `T`. Evaluated in a `const` spanned
    /// at `F`, so that its bounds and its checks are reported there: a different event name
    /// (`other_name` is the message) or a version not lower than `version` (`not_older`). The
    /// derive states the bounds first through trait item paths at the same spans, which rustc
    /// reports without a note into this function, and then drops these as duplicates.
    pub const fn upcaster<F, T>(
        name: &str,
        version: u32,
        other_name: &'static str,
        not_older: &'static str,
    ) -> crate::Upcaster
    where
        F: DomainEvent + UpcastSource,
        T: DomainEvent + UpcastFrom<F>,
    {
        if !str_eq(F::NAME, name) {
            panic!("{}", other_name);
        }
        if F::VERSION >= version {
            panic!("{}", not_older);
        }
        crate::Upcaster {
            from: EventDescriptor::of::<F>,
            convert: crate::upcast::upcast_envelope::<F, T>,
        }
    }

    pub(crate) const fn str_eq(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }

    /// `Box::pin`, with no bound: the generated code coerces the box to `HandlerFuture`, so a
    /// future that is not `Send` is reported as that cast, at the handler's `async`, rather
    /// than as a bound of a function in this module. (Not `Box::pin` written out: under
    /// `unused_qualifications` the path would be flagged at the user's `async`.)
    pub fn box_pin<F>(future: F) -> core::pin::Pin<Box<F>> {
        Box::pin(future)
    }

    // The builtin macros generated code calls, so that a user macro of the same name in scope
    // does not replace them.
    pub use core::result::Result;
    pub use core::{concat, file, line, module_path};

    // Parameter adapters. `#[event_handler]` builds one `const` per parameter, a struct literal
    // whose fields name the parameter type's trait items (`<T as ResourceArg>::get`): the only
    // place the generated code states the trait bound, so a wrong parameter type is reported
    // once, at the parameter, and the entry point and the descriptor (which read the adapter's
    // fields) repeat nothing that could fail again. A trait item path, unlike a call of a
    // function with a `where` clause, adds no "required by a bound in" note (see `bounds`).

    /// The event parameter (`&E` or `&Envelope<E>`) of a handler:
    /// `EventParam { get: <A as EventArg>::from_context, events: <A as EventArg>::EVENTS, … }`.
    pub struct EventParam<A: 'static> {
        /// The parameter from the context's envelope.
        pub get: for<'b> fn(&HandlerContext<'b>) -> Result<EventRef<'b, A>, HandlerError>,
        /// The descriptors of the event types.
        pub events: &'static [fn() -> EventDescriptor],
        /// `true` for `Envelope<E>`.
        pub takes_envelope: bool,
    }

    /// A `&T` resource parameter of a handler: `get` is `<T as ResourceArg>::get`.
    pub struct ResourceParam<T: 'static> {
        /// Borrows the resource at an index (parameter order) from the context.
        pub get: for<'b> fn(&HandlerContext<'b>, usize) -> Result<&'b T, HandlerError>,
        /// The descriptor of `T`.
        pub descriptor: ResourceDescriptor,
    }

    /// The `&mut T` transaction parameter of a handler: `take` is `<T as TransactionArg>::take`.
    pub struct TransactionParam<T: 'static> {
        /// Takes the transaction from the context.
        pub take: for<'b> fn(&mut HandlerContext<'b>) -> Result<&'b mut T, HandlerError>,
        /// The descriptor of `T`.
        pub descriptor: ResourceDescriptor,
    }

    /// A handler's return type `R` and its error type `E`: for `Result<(), E>` written out,
    /// `split` is `<R as ReturnArg>::split` and `error` `<E as ErrorArg>::into_handler_error`;
    /// for any other type, `split` is `<R as IntoHandlerResult>::into_handler_result` and
    /// `error` [`same_error`].
    pub struct ReturnParam<R, E> {
        /// `()` as `Ok(())`, a `Result<(), E>` as it is.
        pub split: fn(R) -> Result<(), E>,
        /// Converts the error.
        pub error: fn(E) -> HandlerError,
    }

    impl<R, E> ReturnParam<R, E> {
        /// Converts the returned value.
        #[inline(always)]
        pub fn convert(&self, value: R) -> Result<(), HandlerError> {
            (self.split)(value).map_err(self.error)
        }
    }

    /// The `error` of a [`ReturnParam`] whose `split` already gives a `HandlerError`.
    #[inline(always)]
    pub fn same_error(error: HandlerError) -> HandlerError {
        error
    }
}
