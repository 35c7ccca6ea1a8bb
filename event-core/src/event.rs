//! The `DomainEvent` trait and the descriptor the derive submits to `inventory`.
//! Owns the identity of an event type (name, version); knows nothing of delivery.

use std::any::TypeId;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::envelope::{AnyEnvelope, Envelope, RawEnvelope};
use crate::error::DecodeError;
use crate::upcast::Upcaster;

/// A fact that happened in the domain, identified on the wire by ([`NAME`](Self::NAME),
/// [`VERSION`](Self::VERSION)).
///
/// Implement it with `#[derive(DomainEvent)]`, never by hand: the derive also registers the
/// type with the registry (through `inventory`) and checks the attribute at compile time.
///
/// ```
/// use event_core::DomainEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 1)]
/// struct OrderPlaced {
///     #[event(aggregate_id)]
///     order_id: String,
///     customer_id: String,
/// }
///
/// assert_eq!(OrderPlaced::NAME, "order.placed");
/// assert_eq!(OrderPlaced::VERSION, 1);
/// assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
/// let e = OrderPlaced { order_id: "US-2019-103800".into(), customer_id: "DP-13000".into() };
/// assert_eq!(e.aggregate_id(), "US-2019-103800");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a domain event",
    label = "`{Self}` does not implement `DomainEvent`",
    note = "add `#[derive(event_core::DomainEvent)]` and `#[event(name = \"context.action\", version = 1)]` to the definition of `{Self}`"
)]
pub trait DomainEvent: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The discriminator tag, lower-case and dot-separated `context.action` (`order.placed`).
    /// Carried as the CloudEvents `type` attribute.
    const NAME: &'static str;
    /// The schema version of this payload shape, starting at 1.
    const VERSION: u32;
    /// The aggregate type the event belongs to. Defaults to the context part of
    /// [`NAME`](Self::NAME) (`order` for `order.placed`); set with `#[event(aggregate = "…")]`.
    const AGGREGATE_TYPE: &'static str;

    /// The type of the field marked `#[event(aggregate_id)]`.
    type AggregateId: fmt::Display + ?Sized;

    /// The id of the aggregate instance this event belongs to (the field marked
    /// `#[event(aggregate_id)]`). Carried as the CloudEvents `subject` attribute.
    fn aggregate_id(&self) -> &Self::AggregateId;

    /// The JSON Schema (draft 2020-12) of the payload, when the type also derives
    /// `schemars::JsonSchema`; `None` otherwise. `#[derive(DomainEvent)]` fills it in; it feeds
    /// the schema catalog and its compatibility check.
    fn json_schema() -> Option<serde_json::Value> {
        None
    }

    /// The upcaster from the previous version of this event, declared with
    /// `#[event(upcast_from = OrderPlacedV1)]`; `None` for an event without one (its first
    /// version). See [`Upcaster`] for the rules.
    const UPCAST_FROM: Option<Upcaster> = None;

    /// Whether a payload field this type does not know is a decode error
    /// ([`DecodeError::UnknownField`]) rather than ignored: `#[event(deny_unknown_fields)]`.
    /// `false` by default, so that a consumer keeps decoding what a newer producer sends.
    const DENY_UNKNOWN_FIELDS: bool = false;

    /// The JSON names of the payload fields marked `#[event(sensitive)]` (serde's names, after
    /// `rename`/`rename_all`): personal or secret values the runtime masks wherever it prints
    /// an envelope (`events dlq show --payload`, logs) and that the schema catalog marks
    /// `"x-sensitive": true`. Empty by default. Top-level fields only: a nested value is masked
    /// whole.
    const SENSITIVE_FIELDS: &'static [&'static str] = &[];
}

/// Everything the runtime needs to know about one event type, without knowing the type.
///
/// Built by [`EventDescriptor::of`]; `#[derive(DomainEvent)]` submits one per type to
/// `inventory`.
#[derive(Clone, Copy)]
pub struct EventDescriptor {
    /// [`DomainEvent::NAME`].
    pub name: &'static str,
    /// [`DomainEvent::VERSION`].
    pub version: u32,
    /// [`DomainEvent::AGGREGATE_TYPE`].
    pub aggregate_type: &'static str,
    /// The Rust type name, for error messages (`my_crate::OrderPlaced`).
    pub type_name: &'static str,
    /// The Rust type id, the key of typed dispatch.
    pub type_id: fn() -> TypeId,
    /// Decodes a raw envelope whose name and version match into a typed [`Envelope`].
    pub decode: fn(&RawEnvelope) -> Result<Box<dyn AnyEnvelope>, DecodeError>,
    /// The payload's JSON Schema ([`DomainEvent::json_schema`]).
    pub schema: fn() -> Option<serde_json::Value>,
    /// The upcaster from the previous version ([`DomainEvent::UPCAST_FROM`]).
    pub upcast_from: Option<Upcaster>,
    /// [`DomainEvent::DENY_UNKNOWN_FIELDS`].
    pub deny_unknown_fields: bool,
    /// [`DomainEvent::SENSITIVE_FIELDS`].
    pub sensitive_fields: &'static [&'static str],
}

impl EventDescriptor {
    /// The descriptor of `E`.
    pub fn of<E: DomainEvent>() -> Self {
        EventDescriptor {
            name: E::NAME,
            version: E::VERSION,
            aggregate_type: E::AGGREGATE_TYPE,
            type_name: std::any::type_name::<E>(),
            type_id: TypeId::of::<E>,
            decode: decode_boxed::<E>,
            schema: E::json_schema,
            upcast_from: E::UPCAST_FROM,
            deny_unknown_fields: E::DENY_UNKNOWN_FIELDS,
            sensitive_fields: E::SENSITIVE_FIELDS,
        }
    }
}

impl fmt::Debug for EventDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventDescriptor")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("aggregate_type", &self.aggregate_type)
            .field("type_name", &self.type_name)
            .field("upcast_from", &self.upcast_from)
            .field("deny_unknown_fields", &self.deny_unknown_fields)
            .field("sensitive_fields", &self.sensitive_fields)
            .finish()
    }
}

fn decode_boxed<E: DomainEvent>(raw: &RawEnvelope) -> Result<Box<dyn AnyEnvelope>, DecodeError> {
    Envelope::<E>::decode(raw).map(|e| Box::new(e) as Box<dyn AnyEnvelope>)
}

/// Checks the `context.action` naming rule the derive enforces at compile time: lower-case
/// ASCII letters, digits and `_`, in two or more non-empty segments separated by single dots,
/// each segment starting with a letter.
///
/// Returns a description of the first violation.
pub fn check_event_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("the name is empty");
    }
    let mut segments = 0;
    for segment in name.split('.') {
        segments += 1;
        let mut chars = segment.chars();
        match chars.next() {
            None => return Err("a segment is empty (leading, trailing or doubled `.`)"),
            Some(c) if !c.is_ascii_lowercase() => {
                return Err("each segment must start with a lower-case ASCII letter")
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return Err("segments may only hold lower-case ASCII letters, digits and `_`");
        }
    }
    if segments < 2 {
        return Err("the name needs at least two segments, `context.action`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_event_name;

    #[test]
    fn names_follow_context_action() {
        assert!(check_event_name("order.placed").is_ok());
        assert!(check_event_name("order.line_added").is_ok());
        assert!(check_event_name("billing.invoice.sent2").is_ok());
        for bad in [
            "",
            "order",
            "Order.Placed",
            "order..placed",
            "order.placed.",
            ".order",
            "order.1x",
            "order.pla ced",
        ] {
            assert!(check_event_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
