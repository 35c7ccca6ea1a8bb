//! Upcasters: how an envelope of an older version of an event becomes one of the next version.
//! Owns the conversion of one step; walking a chain and choosing the target is the runtime's.

use std::fmt;

use crate::__private::{UpcastFrom, UpcastSource};
use crate::envelope::{AnyEnvelope, Envelope};
use crate::event::{DomainEvent, EventDescriptor};

/// One step of an upcast chain: converts an envelope of the previous version of an event
/// (`from`) into the version that declared it with `#[event(upcast_from = …)]`.
///
/// Built by the derive ([`Upcaster::of`]), carried by the newer version's
/// [`DomainEvent::UPCAST_FROM`] and [`EventDescriptor::upcast_from`], and registered with it:
/// the runtime walks the chain.
///
/// # Versions and upcasting
///
/// An event type is identified on the wire by (name, version). Each version is its own Rust
/// type; the newer one declares where it comes from, and the conversion is a plain `From`:
///
/// ```
/// use event_core::{DomainEvent, Envelope};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 1)]
/// struct OrderPlacedV1 {
///     #[event(aggregate_id)]
///     order_id: String,
///     country: String,
/// }
///
/// #[derive(Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
/// struct OrderPlacedV2 {
///     #[event(aggregate_id)]
///     order_id: String,
///     country: String,
///     currency: String,
/// }
///
/// impl From<OrderPlacedV1> for OrderPlacedV2 {
///     fn from(v1: OrderPlacedV1) -> Self {
///         let currency = if v1.country == "Canada" { "CAD" } else { "USD" };
///         OrderPlacedV2 { order_id: v1.order_id, country: v1.country, currency: currency.into() }
///     }
/// }
///
/// let upcaster = OrderPlacedV2::UPCAST_FROM.expect("declared with upcast_from");
/// assert_eq!((upcaster.from)().version, 1);
///
/// let old = Envelope::new(OrderPlacedV1 { order_id: "CA-1".into(), country: "Canada".into() })
///     .with_sequence(3);
/// let new = (upcaster.convert)(&old).expect("an envelope of the `from` type");
/// let new = new.as_any().downcast_ref::<Envelope<OrderPlacedV2>>().unwrap();
/// assert_eq!(new.event().currency, "CAD");
/// assert_eq!((new.id(), new.sequence()), (old.id(), 3));
/// ```
///
/// The rules, checked at compile time by the derive or at start-up by the registry:
///
/// - `upcast_from` names an event with the **same name** and a **lower version**
///   (compile error otherwise), that implements **`Clone`**, and the newer type implements
///   `From<Older>` (compile errors otherwise).
/// - The versions of one name form **one chain without gaps**: every registered version but the
///   lowest upcasts from the version registered just below it, and no version is upcast from
///   twice (start-up errors naming the types). The older type is registered automatically with
///   the newer one, so that a registry that knows v3 decodes v1 and v2 envelopes too.
/// - A handler takes **the newest version** of its event (start-up error otherwise): older
///   envelopes are upcast step by step (v1 → v2 → v3) before it runs; an envelope is never
///   downcast.
///
/// # Why `Clone`
///
/// An upcaster converts a *borrowed* envelope: the original is still what the outbox stores,
/// what the dead letter queue keeps byte for byte, and what other code may hold. The older
/// payload is cloned and the clone is moved into `From::from`. This is cheaper and more exact
/// than a round trip through serde (which would also re-apply `skip_serializing`, defaults and
/// renames), and cannot fail. Upcasting is off the hot path: only envelopes of an older
/// version pay for it.
///
/// The metadata is kept as it is: event id, sequence, time, source, aggregate type and id,
/// correlation and causation ids and headers are those of the original envelope; only the
/// payload type changes. The idempotency key (handler name, event id) therefore does not
/// change with the version an event is delivered as.
#[derive(Clone, Copy)]
pub struct Upcaster {
    /// The descriptor of the older version.
    pub from: fn() -> EventDescriptor,
    /// Converts an `Envelope<From>` into an `Envelope<To>` with the same metadata. `None` when
    /// the envelope is not of the `from` type.
    pub convert: fn(&dyn AnyEnvelope) -> Option<Box<dyn AnyEnvelope>>,
}

impl Upcaster {
    /// The upcaster from `F` to `T`, through `T: From<F>` on a clone of the payload.
    pub const fn of<F, T>() -> Self
    where
        F: DomainEvent + Clone,
        T: DomainEvent + From<F>,
    {
        Upcaster {
            from: EventDescriptor::of::<F>,
            convert: upcast_envelope::<F, T>,
        }
    }
}

impl fmt::Debug for Upcaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = (self.from)();
        f.debug_struct("Upcaster")
            .field("from", &format_args!("{} v{}", from.name, from.version))
            .finish_non_exhaustive()
    }
}

/// Through `UpcastSource` and `UpcastFrom`, which every `Clone` and `From` type implements:
/// the derive's `__private::upcaster` states those bounds rather than `Clone` and `From`.
pub(crate) fn upcast_envelope<F, T>(envelope: &dyn AnyEnvelope) -> Option<Box<dyn AnyEnvelope>>
where
    F: DomainEvent + UpcastSource,
    T: DomainEvent + UpcastFrom<F>,
{
    let old = envelope.as_any().downcast_ref::<Envelope<F>>()?;
    let event = T::upcast(old.event().clone_event());
    Some(Box::new(Envelope::from_parts(
        old.metadata().clone(),
        event,
    )))
}
