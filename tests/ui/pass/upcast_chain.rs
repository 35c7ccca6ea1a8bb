// A chain of three versions: v1 → v2 → v3, each declared on the newer type with its `From`.
use event_core::{DomainEvent, Envelope};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
}

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
    country: String,
}

impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 { order_id: v1.order_id, country: "United States".into() }
    }
}

mod v3 {
    use super::*;

    // A path as the value, and the keys in another order.
    #[derive(Serialize, Deserialize, DomainEvent)]
    #[event(upcast_from = super::OrderPlacedV2, version = 3, name = "order.placed", deny_unknown_fields)]
    pub(crate) struct OrderPlaced {
        #[event(aggregate_id)]
        pub(crate) order_id: String,
        pub(crate) country: String,
        pub(crate) currency: String,
    }

    impl From<OrderPlacedV2> for OrderPlaced {
        fn from(v2: OrderPlacedV2) -> Self {
            let currency = if v2.country == "Canada" { "CAD" } else { "USD" };
            OrderPlaced { order_id: v2.order_id, country: v2.country, currency: currency.into() }
        }
    }
}

fn main() {
    assert!(OrderPlacedV1::UPCAST_FROM.is_none());
    let to_v2 = OrderPlacedV2::UPCAST_FROM.unwrap();
    let to_v3 = v3::OrderPlaced::UPCAST_FROM.unwrap();
    assert_eq!(((to_v2.from)().version, (to_v3.from)().version), (1, 2));
    assert!(v3::OrderPlaced::DENY_UNKNOWN_FIELDS && !OrderPlacedV2::DENY_UNKNOWN_FIELDS);

    let v1 = Envelope::new(OrderPlacedV1 { order_id: "A-1".into() }).with_sequence(4);
    let v2 = (to_v2.convert)(&v1).unwrap();
    let v3 = (to_v3.convert)(&*v2).unwrap();
    assert_eq!((v3.version(), v3.metadata().id, v3.metadata().sequence), (3, v1.id(), 4));
    let v3 = v3.as_any().downcast_ref::<Envelope<v3::OrderPlaced>>().unwrap();
    assert_eq!(v3.event().currency, "USD");
    // A step applies only to its own `from` type.
    assert!((to_v3.convert)(&v1).is_none());
}
