//! What `#[derive(EventUnion)]` builds on: one [`UnionVariant`] per variant, holding the
//! variant's event descriptor and the functions that build the union from an envelope of it.
//! Not public API (reached through `__private`); routing stays the runtime's type table.

use crate::envelope::Envelope;
use crate::event::{DomainEvent, EventDescriptor};
use crate::handler::HandlerContext;

/// Wraps one variant's event into the union: `#[derive(EventUnion)]` implements it once per
/// variant, so that two variants holding the same type conflict at compile time.
pub trait Variant<T> {
    /// `Union::Variant(event)`.
    fn wrap(event: T) -> Self;
}

/// `Clone`, with an error that says why a union variant needs it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` must implement `Clone` to be held by an event union",
    label = "a variant of an event union must be `Clone`",
    note = "add `#[derive(Clone)]` to `{Self}`: a union handler is given the union built around a clone of the event, because the envelope keeps the original for the other handlers"
)]
pub trait UnionVariantClone {
    /// A clone of the event, for the union.
    fn clone_event(&self) -> Self
    where
        Self: Sized;
}
// No `Clone` supertrait: `<T as UnionVariantClone>` then fails as itself, with this message,
// rather than as `Clone` (see `bounds`).
impl<T: Clone> UnionVariantClone for T {
    #[inline(always)]
    fn clone_event(&self) -> T {
        self.clone()
    }
}

/// One variant of an event union `U`.
pub struct UnionVariant<U: 'static> {
    /// The descriptor of the variant's event.
    pub describe: fn() -> EventDescriptor,
    /// The event's wire name.
    pub name: &'static str,
    /// The event's aggregate type.
    pub aggregate_type: &'static str,
    /// The union, when the context's envelope holds this variant's event.
    pub event: for<'a> fn(&HandlerContext<'a>) -> Option<U>,
    /// The same, with the envelope's metadata.
    pub envelope: for<'a> fn(&HandlerContext<'a>) -> Option<Envelope<U>>,
}

impl<U: 'static> UnionVariant<U> {
    /// The variant holding `T`; requires `T: DomainEvent + Clone`. Built in a `const` spanned
    /// at the variant's type, so that an unmet bound is reported there, once: the derive
    /// states `T: DomainEvent` and `T: UnionVariantClone` first through trait item paths at the
    /// same span, which rustc reports without a note into this function, and then drops the
    /// same bounds of this call as duplicates.
    pub const fn new<T>() -> Self
    where
        T: DomainEvent + UnionVariantClone,
        U: Variant<T>,
    {
        UnionVariant {
            describe: EventDescriptor::of::<T>,
            name: T::NAME,
            aggregate_type: T::AGGREGATE_TYPE,
            event: variant_event::<T, U>,
            envelope: variant_envelope::<T, U>,
        }
    }
}

fn variant_event<T: DomainEvent + UnionVariantClone, U: Variant<T>>(
    ctx: &HandlerContext<'_>,
) -> Option<U> {
    ctx.try_envelope::<T>()
        .map(|e| U::wrap(e.event().clone_event()))
}

fn variant_envelope<T: DomainEvent + UnionVariantClone, U: Variant<T>>(
    ctx: &HandlerContext<'_>,
) -> Option<Envelope<U>> {
    ctx.try_envelope::<T>()
        .map(|e| e.map_cloned(|event| U::wrap(event.clone_event())))
}

/// The checks on a union that need the variants' events, evaluated at compile time: every
/// variant of one aggregate type (`mixed` is the message otherwise), and no event name twice
/// (`twice`).
pub const fn check_union(
    aggregate_types: &[&str],
    names: &[&str],
    mixed: &'static str,
    twice: &'static str,
) {
    let mut i = 0;
    while i < aggregate_types.len() {
        if !crate::__private::str_eq(aggregate_types[i], aggregate_types[0]) {
            panic!("{}", mixed);
        }
        let mut j = 0;
        while j < i {
            if crate::__private::str_eq(names[i], names[j]) {
                panic!("{}", twice);
            }
            j += 1;
        }
        i += 1;
    }
}
